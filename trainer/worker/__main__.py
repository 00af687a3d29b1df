"""``python -m trainer.worker`` (and the DeepSpeed launcher's ``--module trainer.worker``)."""
import sys

from trainer.worker.train.recipe import main

sys.exit(main())
