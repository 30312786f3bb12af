"""Does it fit, and where does each byte go? Pure Python over the GGUF header.

- ``planner``        KV cache, weights, compute and output buffers, per device
- ``compute_graph``  the compute buffer, by replaying llama.cpp's worst-case graph
- ``placement``      several devices: this machine's and RPC workers'
- ``fitting``        the one fitting service: the config that fits a budget
- ``verdict``        the fitting service's answer, phrased for a table
- ``memcheck``       llama.cpp's logged allocations against the plan, after a load
- ``referee``        llama.cpp's dry run of a load, in a child process
- ``prepare``        the one way in to a load: the fit, refereed by the dry run
- ``hardware``       this machine's GPU budget and RAM
- ``workers``        llama.cpp RPC workers seen from the client: parse, probe
"""
