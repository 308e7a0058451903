"""Adapters: numpy_ref (CI), callable (any module:function), torch_sdpa, flex, triton_flash (need torch / triton)."""
