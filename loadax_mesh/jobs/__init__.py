"""Running on a mesh: batches, distributed init and the launcher."""
