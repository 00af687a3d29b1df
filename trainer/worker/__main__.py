"""``python -m trainer.worker`` (and the DeepSpeed launcher's ``--module trainer.worker``)."""
import sys

from trainer.worker.main import main

sys.exit(main())
