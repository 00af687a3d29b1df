"""``python -m trainer.worker`` (and the DeepSpeed launcher's ``--module trainer.worker``)."""
import os
import sys

from trainer.worker.train.recipe import main

code = main()
if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
    # A rank of a launched run leaves without the interpreter's teardown: its files and events are written and its
    # process group closed, and a C++ thread still joinable at static destruction aborted a rank now and then
    # ("terminate called without an active exception", SIGABRT after the run's `finished` event), which the
    # launcher reports as a failed run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
sys.exit(code)
