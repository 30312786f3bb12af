"""Data files: the model catalog lives in ``localllm.catalog``; small test vocabularies live here."""
