"""Small shared helpers: errors with fixes, atomic writes, paths, progress bars, durations."""
