"""Looking inside models: contextual features, nearest neighbours (probing and attention
analysis come in a later wave)."""
