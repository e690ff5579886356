"""Running the method: inference on seqio tasks, partitioning, multi-host, output directories."""
