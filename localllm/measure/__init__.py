"""Measuring: throughput as llama-bench reports it (``bench``), a load test of
any OpenAI-compatible server (``loadtest``), what quantization costs
(``quality``), the decode ceiling from memory bandwidth (``roofline``), the
"model is slow" checklist (``doctor``) and its one-line verdict (``diagnose``)."""
