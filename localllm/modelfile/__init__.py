"""The model file: a GGUF header read and validated without loading the model
(``gguf_file``), what the model is (``model_info``), and llama.cpp's cache rules
per architecture (``arch_rules``). Pure Python; not named ``gguf``, which is a
dependency."""
