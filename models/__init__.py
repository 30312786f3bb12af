"""Data files: the model catalog lives in ``localllm.store.resolver``; small test vocabularies live here."""
