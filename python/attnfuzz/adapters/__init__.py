"""Adapters: numpy_ref (CI), callable (any module:function), torch_sdpa, torch_varlen, flex, triton_flash (need torch /
triton), jax_attention, pallas_attention (need jax)."""
