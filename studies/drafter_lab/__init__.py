"""The drafter-research harness: drafter architectures (`arch`), training recipes (`recipes`), drafter variants
on one teacher set (`variants`, the shared code of studies/2026-11-30-drafter-variants/) and a training step's
profile (`profile_train_step`). Run from the repository root: `python -m studies.drafter_lab.arch --help`."""
