"""The fuzz test's subsystem: the verdict on one drawn program by mechanism (``verdict``) and the tally of
what a run's programs showed (``tally``), read by the report and by ``expectations update``. The programs
themselves are drawn by ``pytest_ptn.strategies``, a public name of its own."""
