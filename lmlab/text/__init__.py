"""lmlab.text: raw text -- the corpus format, sentence splitting, corpus sources."""
