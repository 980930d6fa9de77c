"""The messages between the router and its workers, one dataclass each (pickled over a multiprocessing Pipe).

    router → worker: AttachStore once, then Prefill, Decode, Abort; Stop last.
    worker → router: Ready or Broken once; then Prefilled, Admitted, Dropped, Deltas, Failed, Released.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from infragent.engine.disagg.store import StoreLayout
from infragent.engine.sampling import SamplingParams


@dataclass(frozen=True)
class AttachStore:
    """Where the KV store is: ("shm", name, layout) or ("tcp", host, port, layout)."""

    address: tuple


@dataclass(frozen=True)
class Prefill:
    """Compute a prompt into the store's blocks (and a KDA state slot) and sample its first token."""

    rid: str
    token_ids: list[int]
    params: SamplingParams
    blocks: list[int]
    state_slot: int | None


@dataclass(frozen=True)
class Decode:
    """Admit a prefilled request from the store when there is room, then decode it."""

    rid: str
    token_ids: list[int]
    params: SamplingParams
    first_token: int
    generator_state: bytes | None
    blocks: list[int]
    state_slot: int | None


@dataclass(frozen=True)
class Abort:
    """Drop the request wherever it is."""

    rid: str


@dataclass(frozen=True)
class Stop:
    """Stop serving and exit."""


@dataclass(frozen=True)
class WorkerInfo:
    """What a ready worker reports: the store layout its cache implies, and the model's limits."""

    layout: StoreLayout
    vocab_size: int
    max_model_len: int


@dataclass(frozen=True)
class Ready:
    """The worker's engine is built."""

    info: WorkerInfo


@dataclass(frozen=True)
class Broken:
    """The worker's engine could not be built, or (after Ready) can run no more steps and the worker leaves."""

    message: str


@dataclass(frozen=True)
class Prefilled:
    """The prompt's KV and states are in the store; its first token, and the sampler's state to go on from."""

    rid: str
    first_token: int
    generator_state: bytes | None


@dataclass(frozen=True)
class Admitted:
    """A decode worker copied the request out of the store (its entry can be freed)."""

    rid: str


@dataclass(frozen=True)
class Dropped:
    """The worker let go of an aborted request (its entry can be freed)."""

    rid: str


@dataclass(frozen=True)
class TextDelta:
    """New text of one decoding request since its last delta."""

    rid: str
    text: str
    completion_tokens: int
    finish_reason: str | None


@dataclass(frozen=True)
class Deltas:
    """One step's text deltas."""

    deltas: list[TextDelta]


@dataclass(frozen=True)
class Failed:
    """The request failed in the worker; released: whether its store entry may be freed now."""

    rid: str
    message: str
    released: bool


@dataclass(frozen=True)
class Released:
    """Store entries held after a transfer timeout, safe to free now that no late rows can land."""

    rids: list[str]


ToWorker = Union[AttachStore, Prefill, Decode, Abort, Stop]
ToRouter = Union[Ready, Broken, Prefilled, Admitted, Dropped, Deltas, Failed, Released]
