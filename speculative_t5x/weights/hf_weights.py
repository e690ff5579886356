"""Hugging Face T5 weights <-> the project's (T5X-layout) parameters, both directions.

The mapping (docs/design.md): T5X kernels are `[in, out]`, torch `nn.Linear` weights
`[out, in]`, so every kernel transposes, and so does the relative-position table (`[H, 32]` in
T5X, `[32, H]` in HF). T5 1.1 has an untied head: `decoder/logits_dense/kernel` <-> its own
`lm_head.weight`, and HF must not rescale the decoder output by `d_model**-0.5`.

The transformers 5.x trap: `T5Config` always sets `tie_word_embeddings=True`, so `lm_head` and
`shared` become one Parameter and loading an untied head overwrites the input embedding. Use
`to_hf_model` (it gives `lm_head` its own Parameter) rather than `from_pretrained` under 5.x.

Damaged files are refused: a safetensors file whose header does not describe its data, or a
`pytorch_model.bin` whose zip records fail their CRC-32, raises a ValueError naming the file; and
by default (`check_finite=True`) a weight holding NaN or inf raises
`t5x_checkpoints.NonFiniteWeightsError` naming its key.

torch is imported only to read `pytorch_model.bin` files and to build a torch model.
"""

import json
import os
import pickle
from typing import Any, Mapping
import zipfile

from flax import traverse_util
import numpy as np
import safetensors
import safetensors.numpy

from speculative_t5x import network
from speculative_t5x.weights import checkpoints
from speculative_t5x.weights import t5x_checkpoints

SAFETENSORS_FILE = "model.safetensors"
TORCH_FILE = "pytorch_model.bin"
CONFIG_FILE = "config.json"
_INDEX_SUFFIX = ".index.json"  # Sharded HF checkpoints: <file>.index.json has a weight_map.
_LAYER_NORM_EPSILON = 1e-6  # layers.RMSNorm's epsilon, as in T5X.
# T5Config.mlp_activations <-> HF feed_forward_proj. HF's 'gated-gelu' is the tanh-approximate
# GELU (flax's default); HF's plain 'gelu' is the exact one, which T5X does not use.
_FEED_FORWARD_PROJ = {
    ("gelu", "linear"): "gated-gelu",
    ("relu", "linear"): "gated-relu",
    ("silu", "linear"): "gated-silu",
    ("relu",): "relu",
    ("silu",): "silu",
}
# Keys HF files may hold that carry no weight of their own: tied copies of `shared`, and a relpos
# table old HF versions created (unused) in the first cross-attention layer.
_EMBEDDING_ALIASES = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
_UNUSED_KEYS = ("decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight",)
_ENCODER_BLOCKS = (
    ("attention", "SelfAttention", "pre_attention_layer_norm"),
    ("mlp", "DenseReluDense", "pre_mlp_layer_norm"),
)
_DECODER_BLOCKS = (
    ("self_attention", "SelfAttention", "pre_self_attention_layer_norm"),
    ("encoder_decoder_attention", "EncDecAttention", "pre_cross_attention_layer_norm"),
    ("mlp", "DenseReluDense", "pre_mlp_layer_norm"),
)


def _key_map(config: network.T5Config) -> list[tuple[str, str, bool]]:
  """(T5X parameter path, HF state-dict key, transposed?) for every parameter of `config`."""
  acts = config.mlp_activations
  mlp_names = ("wi",) if len(acts) == 1 else tuple(f"wi_{i}" for i in range(len(acts)))
  rows = [("token_embedder/embedding", "shared.weight", False)]
  for stack, num_layers, blocks in (
      ("encoder", config.num_encoder_layers, _ENCODER_BLOCKS),
      ("decoder", config.num_decoder_layers, _DECODER_BLOCKS),
  ):
    rows.append(
        (
            f"{stack}/relpos_bias/rel_embedding",
            f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
            True,
        )
    )
    for i in range(num_layers):
      for j, (block, hf_block, norm) in enumerate(blocks):
        hf = f"{stack}.block.{i}.layer.{j}"
        rows.append((f"{stack}/layers_{i}/{norm}/scale", f"{hf}.layer_norm.weight", False))
        names = mlp_names + ("wo",) if block == "mlp" else ("query", "key", "value", "out")
        hf_names = names if block == "mlp" else ("q", "k", "v", "o")
        rows += [
            (f"{stack}/layers_{i}/{block}/{name}/kernel", f"{hf}.{hf_block}.{hf_name}.weight", True)
            for name, hf_name in zip(names, hf_names)
        ]
    rows.append((f"{stack}/{stack}_norm/scale", f"{stack}.final_layer_norm.weight", False))
  if not config.logits_via_embedding:
    rows.append(("decoder/logits_dense/kernel", "lm_head.weight", True))
  return rows


def params_to_hf_state_dict(params: Mapping, config: network.T5Config) -> dict[str, np.ndarray]:
  """HF T5 state dict (numpy, the params' dtype) of `params`; `lm_head.weight` is its own tensor.

  Only `shared.weight` holds the embedding (HF ties `encoder/decoder.embed_tokens` to it).
  """
  checkpoints.check_params(params, network.param_shapes(config), source="params to export")
  flat = traverse_util.flatten_dict(dict(params), sep="/")
  return {
      hf: np.array(np.asarray(flat[path]).T if transpose else flat[path], order="C")
      for path, hf, transpose in _key_map(config)
  }


def _to_numpy(value: Any) -> np.ndarray:
  """float32 numpy array of a numpy array or a torch tensor (bfloat16 included)."""
  if hasattr(value, "detach"):  # torch.Tensor, without importing torch.
    return value.detach().cpu().float().numpy()
  return np.asarray(value).astype(np.float32)


def params_from_hf_state_dict(
    state_dict: Mapping[str, Any],
    config: network.T5Config,
    check_finite: bool = True,
    source: str = "HF state dict",
) -> dict:
  """float32 params for `network.Transformer(config)` from an HF T5 state dict.

  Accepts numpy arrays or torch tensors. The embedding may be under `shared.weight` or the
  `embed_tokens` aliases (which must then agree). One ValueError lists every missing, extra or
  mis-shaped key by name; then, unless check_finite=False, one
  `t5x_checkpoints.NonFiniteWeightsError` every key holding NaN or inf. `source` names the state
  dict in the messages.
  """
  arrays = {key: _to_numpy(value) for key, value in state_dict.items()}
  embeddings = [k for k in ("shared.weight",) + _EMBEDDING_ALIASES if k in arrays]
  for alias in embeddings[1:]:
    if arrays[alias].shape != arrays[embeddings[0]].shape or not np.array_equal(
        arrays[alias], arrays[embeddings[0]], equal_nan=True  # NaN is for check_finite to report.
    ):
      raise ValueError(
          f"{alias} differs from {embeddings[0]}: T5 shares one embedding table "
          "between encoder and decoder"
      )
  if embeddings:
    arrays["shared.weight"] = arrays[embeddings[0]]
  expected = traverse_util.flatten_dict(network.param_shapes(config), sep="/")
  key_map = _key_map(config)
  problems, flat = [], {}
  for path, hf, transpose in key_map:
    want = tuple(reversed(expected[path])) if transpose else tuple(expected[path])
    if hf not in arrays:
      problems.append(f"  missing: {hf} {want} (for {path})")
    elif arrays[hf].shape != want:
      problems.append(f"  wrong shape: {hf} is {arrays[hf].shape}, the config needs {want}")
    else:
      flat[path] = np.ascontiguousarray(arrays[hf].T if transpose else arrays[hf])
  known = {hf for _, hf, _ in key_map} | set(_EMBEDDING_ALIASES) | set(_UNUSED_KEYS)
  if config.logits_via_embedding and "lm_head.weight" in arrays:
    if not np.array_equal(arrays["lm_head.weight"], arrays.get("shared.weight"), equal_nan=True):
      problems.append(
          "  lm_head.weight differs from shared.weight but the config ties the head "
          "(logits_via_embedding=True): use logits_via_embedding=False (T5 1.1)"
      )
    known.add("lm_head.weight")
  problems += [f"  extra: {key} {arrays[key].shape}" for key in sorted(arrays.keys() - known)]
  if problems:
    raise ValueError(
        f"{source} does not match the model config ({len(problems)} problem(s)):"
        "\n" + "\n".join(problems)
    )
  if check_finite:
    t5x_checkpoints.check_params_finite({hf: arrays[hf] for _, hf, _ in key_map}, source)
  return traverse_util.unflatten_dict(flat, sep="/")


def hf_config_dict(config: network.T5Config) -> dict:
  """The `config.json` of an HF T5 with `config`'s architecture (T5 1.1: gated-gelu, untied)."""
  if config.mlp_activations not in _FEED_FORWARD_PROJ:
    raise ValueError(
        f"mlp_activations {config.mlp_activations} has no HF T5 equivalent: use one "
        f"of {sorted(_FEED_FORWARD_PROJ)}"
    )
  return {
      "architectures": ["T5ForConditionalGeneration"],
      "model_type": "t5",
      "is_encoder_decoder": True,
      "vocab_size": config.vocab_size,
      "d_model": config.emb_dim,
      "d_kv": config.head_dim,
      "d_ff": config.mlp_dim,
      "num_heads": config.num_heads,
      "num_layers": config.num_encoder_layers,
      "num_decoder_layers": config.num_decoder_layers,
      "relative_attention_num_buckets": config.relative_attention_num_buckets,
      "relative_attention_max_distance": config.relative_attention_max_distance,
      "dropout_rate": config.dropout_rate,
      "layer_norm_epsilon": _LAYER_NORM_EPSILON,
      "feed_forward_proj": _FEED_FORWARD_PROJ[config.mlp_activations],
      "tie_word_embeddings": config.logits_via_embedding,
      "decoder_start_token_id": 0,
      "pad_token_id": 0,
      "eos_token_id": 1,
  }


def t5_config_from_hf(hf_config: Mapping[str, Any], dtype: str = "float32") -> network.T5Config:
  """The `T5Config` of an HF T5 `config.json` dict; `dtype` is the activation dtype.

  The head is untied when `tie_word_embeddings` is false, or, in files written by transformers
  5.x (which always says true), when `scale_decoder_outputs` is false.
  """
  projections = {v: k for k, v in _FEED_FORWARD_PROJ.items()}
  proj = hf_config.get("feed_forward_proj", "relu")
  if proj not in projections:
    raise ValueError(
        f"HF feed_forward_proj {proj!r} is not supported: use one of "
        f"{sorted(projections)} (plain 'gelu' is exact GELU, which T5X never uses)"
    )
  epsilon = hf_config.get("layer_norm_epsilon", _LAYER_NORM_EPSILON)
  if epsilon != _LAYER_NORM_EPSILON:
    raise ValueError(
        f"HF layer_norm_epsilon {epsilon} != {_LAYER_NORM_EPSILON}, the only one "
        "network.py implements"
    )
  tied = hf_config.get("scale_decoder_outputs", hf_config.get("tie_word_embeddings", True))
  return network.T5Config(
      vocab_size=hf_config["vocab_size"],
      dtype=dtype,
      emb_dim=hf_config["d_model"],
      num_heads=hf_config["num_heads"],
      num_encoder_layers=hf_config["num_layers"],
      num_decoder_layers=hf_config.get("num_decoder_layers") or hf_config["num_layers"],
      head_dim=hf_config["d_kv"],
      mlp_dim=hf_config["d_ff"],
      mlp_activations=projections[proj],
      dropout_rate=hf_config.get("dropout_rate", 0.1),
      logits_via_embedding=bool(tied),
      relative_attention_num_buckets=hf_config.get("relative_attention_num_buckets", 32),
      relative_attention_max_distance=hf_config.get("relative_attention_max_distance", 128),
  )


def load_hf_state_dict(path: str | os.PathLike) -> dict[str, Any]:
  """Tensors of an HF checkpoint: a directory, a `.safetensors` or `.bin` file, or an index.

  A directory is read from `model.safetensors` or else `pytorch_model.bin` (or their sharded
  `*.index.json`). `.bin` files are read with torch (weights only) and returned as torch tensors,
  after their zip records pass their CRC-32 checks. The values are not checked:
  `params_from_hf_state_dict` does that.

  Raises:
    FileNotFoundError: no such file, or a directory without HF weights.
    ValueError: a file that is damaged or truncated (named in the message).
  """
  path = os.fspath(path)
  if os.path.isdir(path):
    candidates = [
        os.path.join(path, name + suffix)
        for name in (SAFETENSORS_FILE, TORCH_FILE)
        for suffix in ("", _INDEX_SUFFIX)
    ]
    found = [c for c in candidates if os.path.isfile(c)]
    if not found:
      raise FileNotFoundError(
          f"{path} has none of {[os.path.basename(c) for c in candidates]}: "
          "not a Hugging Face checkpoint directory"
      )
    path = found[0]
  if not os.path.isfile(path):
    raise FileNotFoundError(f"HF checkpoint file {path} does not exist")
  if path.endswith(_INDEX_SUFFIX):
    with open(path) as f:
      shards = sorted(set(json.load(f)["weight_map"].values()))
    tensors = {}
    for shard in shards:
      tensors.update(load_hf_state_dict(os.path.join(os.path.dirname(path), shard)))
    return tensors
  if path.endswith(".safetensors"):
    try:
      return safetensors.numpy.load_file(path)
    except safetensors.SafetensorError as e:
      raise ValueError(
          f"HF checkpoint file {path} is not a readable safetensors file (damaged or "
          f"truncated: download it again): {e}"
      ) from e
  _check_zip_records(path)
  import torch  # pylint: disable=g-import-not-at-top  (only .bin files need torch)

  try:
    return torch.load(path, map_location="cpu", weights_only=True)
  except (RuntimeError, OSError, EOFError, pickle.UnpicklingError) as e:
    raise ValueError(
        f"HF checkpoint file {path} is not a readable torch file (damaged or truncated: "
        f"download it again): {e}"
    ) from e


def _check_zip_records(path: str) -> None:
  """Raises a ValueError naming `path` and the record if a record of the zip archive torch writes
  (every `.bin` since torch 1.6) fails its CRC-32; torch itself does not check. Older, pickled
  `.bin` files are not zip archives and have nothing to check."""
  if not zipfile.is_zipfile(path):
    return
  try:
    with zipfile.ZipFile(path) as archive:
      damaged = archive.testzip()
  except (zipfile.BadZipFile, OSError) as e:
    raise ValueError(f"HF checkpoint file {path} is a damaged zip archive: {e}") from e
  if damaged is not None:
    raise ValueError(
        f"HF checkpoint file {path} is damaged: its record {damaged!r} fails its CRC-32 "
        "check; download it again"
    )


def load_hf(
    path: str | os.PathLike, dtype: str = "float32", check_finite: bool = True
) -> tuple[dict, network.T5Config]:
  """(params, config) of an HF T5 checkpoint directory holding `config.json` and weights (see
  `load_hf_state_dict` and `params_from_hf_state_dict` for the checks)."""
  config_file = os.path.join(path, CONFIG_FILE)
  if not os.path.isfile(config_file):
    raise FileNotFoundError(
        f"{config_file} does not exist: an HF checkpoint directory needs its " "config.json"
    )
  with open(config_file) as f:
    config = t5_config_from_hf(json.load(f), dtype=dtype)
  params = params_from_hf_state_dict(
      load_hf_state_dict(path), config, check_finite, source=f"HF checkpoint {path}"
  )
  return params, config


def save_hf(directory: str | os.PathLike, params: Mapping, config: network.T5Config) -> None:
  """Writes `model.safetensors` and `config.json`, loadable by transformers (see the 5.x trap)."""
  os.makedirs(directory, exist_ok=True)
  safetensors.numpy.save_file(
      params_to_hf_state_dict(params, config),
      os.path.join(directory, SAFETENSORS_FILE),
      metadata={"format": "pt"},
  )
  with open(os.path.join(directory, CONFIG_FILE), "w") as f:
    json.dump(hf_config_dict(config), f, indent=2, sort_keys=True)


def to_hf_model(params: Mapping, config: network.T5Config):
  """A float32 `transformers.T5ForConditionalGeneration` (eval mode) holding `params`.

  The head gets its own Parameter before loading, so an untied T5 1.1 head survives
  transformers 5.x's forced tying.
  """
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  model = transformers.T5ForConditionalGeneration(transformers.T5Config(**hf_config_dict(config)))
  tensors = {
      k: torch.from_numpy(np.asarray(v, np.float32))
      for k, v in params_to_hf_state_dict(params, config).items()
  }
  if not config.logits_via_embedding:
    model.lm_head.weight = torch.nn.Parameter(tensors["lm_head.weight"].clone())
  result = model.load_state_dict(tensors, strict=False)
  missing = sorted(set(result.missing_keys) - set(_EMBEDDING_ALIASES) - {"lm_head.weight"})
  if missing or result.unexpected_keys:
    raise ValueError(
        f"transformers' T5 did not take the weights: missing {missing}, "
        f"unexpected {result.unexpected_keys}"
    )
  return model.eval()
