"""The fuzz test's subsystem: a test item's share of the programs and the decorator that runs them (``run``),
what the item's programs showed and the test's outcome from it (``record``), the verdict on one drawn
program by mechanism (``verdict``), judged in a child process for a backend known to crash or hang
(``apart``), the tally of what a run's programs showed (``tally``, read by the report and by ``expectations
update``) and the lines that say how far a long fuzz is (``progress``). The programs themselves are drawn
by ``pytest_ptn.strategies``, a public name of its own."""
