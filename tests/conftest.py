"""What only a conftest can do: register the suite's plugins (tests/plugins/, one job each). Helpers that tests
import live in tests/helpers_*.py; how to write a test is in the README ("Writing a test")."""
pytest_plugins = [
    "plugins.session",       # the session folder shared by the xdist workers; one thread per process for PyTorch
    "plugins.zygote",        # heavy children from a pre-imported interpreter; the user_start marker
    "plugins.xdist_groups",  # xdist_group under --dist loadgroup, through xdist's public scheduler hook
    "plugins.watchdog",      # a test stuck in C past its timeout is ended with every thread's stack printed
    "plugins.timings",       # slow phases named as they end; TRAINPILOT_TEST_TIMES=FILE
    "plugins.stand_ins",     # cuda_torch: PyTorch as a replayed GPU recording describes it (this machine is CPU-only)
]
