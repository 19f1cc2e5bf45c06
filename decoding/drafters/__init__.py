"""Draft sources for speculative decoding and DSpark, one module per family behind one interface (LatticeSource)."""
