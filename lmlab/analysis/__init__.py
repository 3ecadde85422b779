"""Looking inside models: contextual features and nearest neighbours, attention maps and head
statistics, layer-wise probing, and word senses by layer."""
