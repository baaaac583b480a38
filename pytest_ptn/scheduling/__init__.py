"""Running the suite under xdist: the seed hand-off, per-case scheduling and worker crash isolation."""
