"""The engine refuses a llama-cpp-python whose structs lack a field it sets.

ctypes would accept the assignment silently (a plain Python attribute that
llama.cpp never reads), so the check must look at ``_fields_`` itself."""

from __future__ import annotations

import ctypes
import types

import llama_cpp

from localllm.engine import missing_struct_fields


def test_the_installed_llama_cpp_python_has_every_field_we_set():
    assert missing_struct_fields() == []


def test_a_struct_without_a_field_is_named():
    class OldContextParams(ctypes.Structure):
        _fields_ = [(n, t) for n, t in llama_cpp.llama_context_params._fields_ if n != "swa_full"]

    old = types.SimpleNamespace(
        llama_model_params=llama_cpp.llama_model_params,
        llama_context_params=OldContextParams,
        llama_model_quantize_params=llama_cpp.llama_model_quantize_params,
    )
    assert missing_struct_fields(old) == ["llama_context_params.swa_full"]
    params = OldContextParams()
    params.swa_full = True  # what the check exists for: ctypes takes it without complaint
