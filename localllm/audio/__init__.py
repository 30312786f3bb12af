"""Audio models' inputs, checked before llama.cpp sees them.

``sound``: the ``AudioClip`` a prompt carries and the limits every reader
holds to. ``read``: a WAV, MP3 or FLAC file (or a request's bytes) into a clip,
each format parsed by its own bounded reader (``wav``, ``mpeg``, ``flac``)
before a sample is decoded, so that a header that lies, a zero sample rate, a
file cut short, ten hours of sound or an MP3 whose header claims a billion
frames costs a header read and one line. ``projector``: what an audio projector
(mmproj) GGUF says about its encoder and how many tokens a clip makes. Nothing
here loads llama.cpp: the engine's ``mtmd`` runs the encoder.
"""
