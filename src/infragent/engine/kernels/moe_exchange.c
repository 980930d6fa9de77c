// An all-to-all between the expert-parallel ranks of one machine through a shared-memory segment: the MoE
// dispatch and combine's native transport (parallel/native_exchange.py), as an intranode communication
// library does it. Plain C, called through ctypes: loaded with ctypes.PyDLL the caller keeps the GIL for the
// whole call, copies and waits included; with ctypes.CDLL it is released.
//
// The segment holds one mailbox per (source, destination) pair: a 64-byte header and `capacity` bytes of rows.
// Every rank makes the same sequence of calls (they run the forward in lock step), numbered by `seq`:
//   send     for each destination, wait until it has read the previous message (done == seq - 1), copy the
//            rows in, publish ready = seq;
//   receive  for each source, wait for ready == seq, check the size, copy the rows out, publish done = seq.
// A rank that dies ends the wait within ~20 ms, one that is stuck after timeout_s: an error code, not a hang.
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

enum { kOk = 0, kTimeout = 1, kSizeMismatch = 2, kTooLarge = 3, kPeerGone = 4 };

typedef struct {
  volatile uint64_t ready;  // seq of the message in the mailbox
  volatile uint64_t done;   // seq of the last message the destination has read
  volatile int64_t bytes;   // its size
  char pad[40];
} Header;

static Header* header(char* base, int64_t capacity, int world, int src, int dst) {
  return (Header*)(base + (int64_t)(src * world + dst) * (capacity + (int64_t)sizeof(Header)));
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// Whether process pid has exited (gone, or a zombie its parent has not reaped yet).
static int gone(int pid) {
  char path[64], stat[256];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE* f = fopen(path, "r");
  if (f == NULL) return 1;
  const size_t n = fread(stat, 1, sizeof stat - 1, f);
  fclose(f);
  stat[n] = 0;
  const char* state = strrchr(stat, ')');  // the state follows the command name, which may hold spaces
  return state == NULL || state[1] == 0 || state[2] == 'Z' || state[2] == 'X';
}

// Spin briefly, then sleep 20 us between looks, so a waiting rank leaves its core to the rest of the machine
// (its own process's other threads included, when the caller released the GIL); every ~20 ms look whether the
// peer is still there.
static int wait_for(volatile uint64_t* word, uint64_t value, double deadline, int peer_pid) {
  double next_check = now() + 0.02;
  for (int spins = 0;; ++spins) {
    if (__atomic_load_n(word, __ATOMIC_ACQUIRE) == value) return kOk;
    if (spins < 2000) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
      continue;
    }
    const struct timespec nap = {0, 20000};
    nanosleep(&nap, NULL);
    if ((spins & 7) == 0) {
      const double t = now();
      if (t > deadline) return kTimeout;
      if (t > next_check) {
        if (peer_pid > 0 && gone(peer_pid)) return kPeerGone;
        next_check = t + 0.02;
      }
    }
  }
}

// Bytes the segment needs for `world` ranks and mailboxes of `capacity` bytes.
int64_t ie_segment_bytes(int world, int64_t capacity) {
  return (int64_t)world * world * (capacity + (int64_t)sizeof(Header));
}

// Send send_bytes[d] bytes (laid out destination after destination in `send`) to every rank d, and receive
// recv_bytes[s] from every rank s into `recv` (source after source); pids[r] is rank r's process. Returns kOk,
// or an error code with the rank it concerns in *peer.
int ie_exchange(char* base, int64_t capacity, int rank, int world, uint64_t seq, const char* send,
                const int64_t* send_bytes, char* recv, const int64_t* recv_bytes, const int* pids, double timeout_s,
                int* peer) {
  const double deadline = now() + timeout_s;
  int64_t offset = 0;
  for (int d = 0; d < world; ++d) {
    *peer = d;
    if (send_bytes[d] > capacity) return kTooLarge;
    Header* h = header(base, capacity, world, rank, d);
    const int waited = wait_for(&h->done, seq - 1, deadline, pids[d]);
    if (waited != kOk) return waited;
    memcpy((char*)h + sizeof(Header), send + offset, (size_t)send_bytes[d]);
    h->bytes = send_bytes[d];
    __atomic_store_n(&h->ready, seq, __ATOMIC_RELEASE);
    offset += send_bytes[d];
  }
  offset = 0;
  for (int s = 0; s < world; ++s) {
    *peer = s;
    Header* h = header(base, capacity, world, s, rank);
    const int waited = wait_for(&h->ready, seq, deadline, pids[s]);
    if (waited != kOk) return waited;
    if (h->bytes != recv_bytes[s]) return kSizeMismatch;
    memcpy(recv + offset, (char*)h + sizeof(Header), (size_t)recv_bytes[s]);
    __atomic_store_n(&h->done, seq, __ATOMIC_RELEASE);
    offset += recv_bytes[s];
  }
  return kOk;
}
