"""Running the suite under xdist and over machines: the seed hand-off, per-case scheduling and worker crash
isolation, one GPU per worker, and shards of a run."""
