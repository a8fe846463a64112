"""The lab's studies: dated measurements, each a folder `<date>-<name>/` with its README (the fields in
studies/README.md), its scripts and its result JSON, and `drafter_lab`, the live drafter-research harness. Not part
of the installed package: run from the repository root (`python -m studies.drafter_lab.arch ...`)."""
