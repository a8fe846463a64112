"""Everything `prepare` builds and keeps: the pipeline, the content-addressed artifact store, bundles, the
embedded mini target, drafter training, the held-out guard, the transformers drafter format and prompt data."""
