"""One pytest run, the pytest side: its state on config.stash, how it stops, the hooks a conftest adds."""
