"""Model families behind one interface: (ModelSpec, HF-named weights) → DecoderModel."""
