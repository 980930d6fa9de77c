"""Model families behind one interface: (ModelShape, HF-named weights) → DecoderModel."""
