"""The storage floor: the home's layout, atomic writes, manifests, locks, identity hashing and tensor I/O
(`artifacts`), the import journal a kill leaves finishable (`journal`), the held-out guard (`heldout`) and the
prompt sets it guards (`data`). It imports nothing above `options.py` and `safeio.py`."""
