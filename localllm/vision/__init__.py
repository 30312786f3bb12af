"""Vision models' inputs, checked before llama.cpp sees them.

``image``: a picture file read through Pillow (PNG, JPEG, WebP, GIF's first
frame) into the RGB bytes libmtmd takes, bounded before it is decoded.
``projector``: what a projector (mmproj) GGUF says about itself, whether it fits
a text model, and where one sits next to its model. ``memory``: what clip.cpp
allocates for it, planned and as its log says. ``marker``: where an image goes
in a prompt's text. Nothing here loads llama.cpp: the engine's ``mtmd`` runs
the projector.
"""
