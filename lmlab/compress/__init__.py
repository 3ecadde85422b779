"""Making trained models smaller and faster: post-training quantisation (``quantize``),
distillation and pruning, one module per method. Import the module you need; this package
imports nothing itself, so each method's dependencies stay lazy."""
