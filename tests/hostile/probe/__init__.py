"""The hostile-input probe: the real CLI against hostile material, each outcome classified.

    python -m tests.hostile.probe [--work DIR] [--lab DIR] [--only GROUP] [--timeout 120] [--show]

(from the repository root). Every case runs the real CLI (`python -m dflash_core ...`, `python -m
dflash_core.report ...`) in a subprocess with its own temporary home next to a folder of bystander files, hashed
before and after, and is classified:

* held      - one `error:` line and exit 2 (or, where the input is fine, the right success), nothing outside the
              home changed, no hang;
* traceback - a Python traceback reached the user (its exit 1 reads as "exactness failed");
* defect    - the wrong exit code or message, a write outside the home, a hang, or a wrong result;
* skipped   - the case needs something this machine lacks (root to mount a small or read-only filesystem).

The tiny lab (`dflash_core.testing.build_tiny_lab`, a tiny LFM2 with a tokenizer, prepared in miniature) stands
in for the mini target, so no case needs the full `prepare`. The whole probe takes tens of minutes, so it is a
manual run (docs/hostile-input.md); `tests/hostile/test_probe.py` runs one quick case of each kind of surface in
the suite. Modules: `judge` (running and classifying one case), `material` (the tiny lab, bundles, a drafter,
schema-7 saved runs, bundle surgery), `builders` (what each case sets up), `cases` (the list), `__main__`.
"""
