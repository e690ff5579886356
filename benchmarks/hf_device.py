"""The project's parameters as a Hugging Face `T5ForConditionalGeneration` on the same device,
without a trip through the host: `hf_weights.to_hf_model` builds a float32 model on the CPU (44 GB
and minutes for a T5-XXL); here the model is built on torch's meta device (no memory, no random
init), and every weight is the JAX array itself handed to torch by DLPack (`torch.from_dlpack`: on
a GPU, the same device memory), transposed on the device where `hf_weights`' mapping says so and
cast to `dtype`. The 5.x trap (reference/hf_t5.md) is handled as `to_hf_model` does: `lm_head`
gets its own Parameter, the two embedding tables are `shared`'s.

A cache dict shared between calls converts each JAX array once, so a drafter made of the target's
own arrays (`device_init.truncated_shared_encoder`, as a full T5 whose encoder is the target's) holds
the same torch tensors as the target.

torch and transformers are imported inside the functions (the package does not need them).
"""

from __future__ import annotations

from typing import Any, Mapping

from flax import traverse_util

from speculative_t5x import network
from speculative_t5x.weights import hf_weights


def to_torch(array: Any, transpose: bool, dtype: Any, cache: dict | None = None) -> Any:
  """A JAX array as a contiguous torch tensor of `dtype` on its device (DLPack), transposed
  (2-D) where asked; with `cache`, each (array, transpose) is converted once."""
  import torch  # pylint: disable=g-import-not-at-top

  key = (id(array), transpose)
  if cache is not None and key in cache:
    return cache[key][1]
  tensor = torch.from_dlpack(array)
  if transpose:
    tensor = tensor.T
  tensor = tensor.to(dtype).contiguous()
  if cache is not None:
    cache[key] = (array, tensor)  # the array is kept alive, so its id stays its own
  return tensor


def to_hf_model_on_device(
    params: Mapping, config: network.T5Config, dtype: Any = None, cache: dict | None = None
) -> Any:
  """A `transformers.T5ForConditionalGeneration` (eval mode) holding `params` (JAX arrays, on
  any device) as torch tensors of `dtype` (default: torch.bfloat16) on the same device.

  Raises ValueError if the model has a parameter or buffer that `params` did not fill.
  """
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  dtype = torch.bfloat16 if dtype is None else dtype
  with torch.device("meta"):
    model = transformers.T5ForConditionalGeneration(
        transformers.T5Config(**hf_weights.hf_config_dict(config))
    )
  flat = traverse_util.flatten_dict(dict(params), sep="/")
  state = {
      hf: to_torch(flat[path], transpose, dtype, cache)
      for path, hf, transpose in hf_weights._key_map(config)  # pylint: disable=protected-access
  }
  model.load_state_dict(state, strict=False, assign=True)
  shared = model.shared.weight
  model.encoder.embed_tokens.weight = shared
  model.decoder.embed_tokens.weight = shared
  if not config.logits_via_embedding:
    model.lm_head.weight = torch.nn.Parameter(state["lm_head.weight"], requires_grad=False)
  else:
    model.lm_head.weight = shared
  unfilled = [
      name
      for name, tensor in list(model.named_parameters(remove_duplicate=False))
      + list(model.named_buffers(remove_duplicate=False))
      if tensor.is_meta
  ]
  if unfilled:
    raise ValueError(f"transformers' T5 has weights the parameters did not fill: {unfilled}")
  model.requires_grad_(False)
  return model.eval()
