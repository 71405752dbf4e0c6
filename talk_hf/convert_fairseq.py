"""Convert a fairseq translation checkpoint (LightConv/DynamicConv; RFA-doc and TaLK through
talk_hf/convert_fairseq_rfa.py and talk_hf/convert_fairseq_talk.py) into a talk_hf model folder.

    convert_fairseq_checkpoint("wmt16.en-de.joined-dict.dynamicconv-glu", "dynamicconv-wmt16-en-de")

The source folder is what fairseq's release archives unpack to: ``model.pt`` (a fairseq checkpoint: the training
``args`` (argparse.Namespace) and/or ``cfg``, and the ``model`` state dict), ``dict.<src>.txt``, ``dict.<tgt>.txt`` and,
for the WMT models, ``bpecodes``. The output folder is a ``save_pretrained`` folder: config, safetensors weights,
generation config, the fairseq tokenizer (talk_hf/tokenization_fairseq.py) and a README.md model card; it loads with
``AutoModelForSeq2SeqLM`` / ``AutoTokenizer`` / ``pipeline("translation")``, with talk_hf imported or as remote code.

The architecture and every hyperparameter come from the checkpoint itself; options the converted model cannot
reproduce exactly (learned positions, adaptive softmax, input/output projections, ...) are refused by name.

What a converted LightConv/DynamicConv model computes, against fairseq (docs/converting.md):

- Decoding (fairseq-generate, the hub interface) is reproduced: fairseq's incremental LightConv/DynamicConv steps
  softmax a kernel over all K taps and drop the taps before the sequence start, which is the talk_hf op everywhere
  (docs/spec.md §B.1). fairseq's teacher-forced DynamicConv decoder normalises only the last T taps when the target is
  shorter than a layer's kernel (T < K); for those short targets its training-mode logits differ from its own
  decoding, and the converted model follows the decoding.
- fairseq's LightConv softmaxes its kernels in float32 even in a float64 model; the converted model keeps the model's
  dtype (differences of order 1e-7 in float64).
- Generation defaults are fairseq-generate's (beam 5, lenpen 1, min_len 1, max_len_a 0, max_len_b 200, <pad> never
  generated) unless the checkpoint's cfg/args say otherwise. fairseq allows ``max_len_a * src_len + max_len_b``
  tokens and then forces </s>; transformers has no source-length rule, so the generation config holds
  ``max_length = max_len_b + 2`` (the decoder start and max_len_b + 1 new tokens; ``min_length = min_len + 1``, so
  that a ``max_length`` or ``max_new_tokens`` given per call replaces them as for any transformers model) with
  ``forced_eos_token_id`` (a checkpoint with max_len_a != 0 is converted with a warning). A hypothesis cut at the
  limit scores its forced </s> as log-probability 0 in transformers and as its real log-probability in fairseq, so
  hypotheses that reach the limit can rank differently.
"""

import argparse
import logging
import pickle
import re
from pathlib import Path

import torch

from .configuration_dynamic_conv import DynamicConvConfig
from .tokenization_fairseq import FairseqMosesBpeTokenizer, load_fairseq_dictionary

logger = logging.getLogger(__name__)


class TrainingMeter:
    """What a fairseq training meter in a checkpoint's extra_state unpickles to: the pickled state, kept as it is in
    `state`, with no behaviour (the converter ignores extra_state)."""

    def __setstate__(self, state):
        self.state = state


def _meter_stand_in(module, name):
    """A TrainingMeter subclass that a pickle names as module.name."""
    return type(name, (TrainingMeter,), {"__module__": module, "__qualname__": name})


# The meter classes fairseq's Trainer keeps (fairseq.meters in 0.6-0.9, fairseq.logging.meters later); fairseq 0.6-0.9
# pickle them into a checkpoint's extra_state["train_meters"].
TRAINING_METERS = [
    _meter_stand_in(module, name)
    for module, names in [("fairseq.meters", ("AverageMeter", "TimeMeter", "StopwatchMeter")),
                          ("fairseq.logging.meters", ("AverageMeter", "SumMeter", "ConcatTensorMeter", "TimeMeter",
                                                      "StopwatchMeter"))]
    for name in names
]


def _numpy_array_globals():
    """What a pickled numpy array or scalar names, under numpy 1.x's module (numpy.core) and 2.x's (numpy._core): a
    checkpoint of `fairseq-train --eval-bleu` keeps the BLEU counts it logged as arrays in extra_state["metrics"].
    Unpickling rebuilds the array from its dtype and bytes; the dtypes are the boolean and numeric ones (an object,
    string or datetime array is refused, naming its dtype class)."""
    import numpy

    core = numpy._core.multiarray if hasattr(numpy, "_core") else numpy.core.multiarray
    names = ("numpy.core.multiarray", "numpy._core.multiarray")
    codes = "?" + numpy.typecodes["AllInteger"] + numpy.typecodes["AllFloat"]
    dtype_classes = {type(numpy.dtype(code)) for code in codes}  # a dtype's state is set on its class (BUILD)
    return [numpy.ndarray, numpy.dtype, *sorted(dtype_classes, key=str),
            *[(core._reconstruct, f"{module}._reconstruct") for module in names],
            *[(core.scalar, f"{module}.scalar") for module in names]]


# The globals a fairseq checkpoint's pickle may name besides torch's tensors and plain containers (which
# weights_only loading allows by itself): the training arguments, the training meters and numpy arrays. fairseq >=
# 0.10 stores `cfg` as plain containers (OmegaConf.to_container), with the model's arguments still an
# argparse.Namespace; older releases store `args`. A Namespace is a plain attribute bag: unpickling it sets
# attributes and runs no code; a meter unpickles to a TrainingMeter, which only stores its state.
ALLOWED_GLOBALS = [argparse.Namespace, *TRAINING_METERS, *_numpy_array_globals()]
GIT_LFS_POINTER = b"version https://git-lfs.github.com/spec/v1"  # the first line of a Git LFS pointer file

LIGHTCONV_ARCHS = (
    "lightconv", "lightconv_iwslt_de_en", "lightconv_wmt_en_de", "lightconv_wmt_en_de_big", "lightconv_wmt_en_fr_big",
    "lightconv_wmt_zh_en_big",
)
FAIRSEQ_SPECIAL_IDS = dict(bos_token_id=0, pad_token_id=1, eos_token_id=2, unk_token_id=3)
# fairseq-generate's defaults (fairseq/dataclass/configs.py, GenerationConfig)
GENERATION_DEFAULTS = dict(beam=5, lenpen=1.0, min_len=1, max_len_a=0.0, max_len_b=200, unkpen=0.0)


# ---------------------------------------------------------------------------------------------------------------
# Reading the checkpoint


def load_checkpoint(path):
    """A fairseq checkpoint file -> its dict, unpickled with torch's weights-only unpickler and ALLOWED_GLOBALS.
    A file naming any other global is refused (ValueError naming it) before any of it is constructed; a file that is
    no PyTorch checkpoint (empty, a Git LFS pointer, a web page, a damaged file) is a ValueError saying so, with
    torch's error."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no fairseq checkpoint at {path}")
    try:
        with torch.serialization.safe_globals(ALLOWED_GLOBALS):
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        name = refused_global(err)
        if name is None:
            raise unreadable_checkpoint(path, err) from err
        raise ValueError(
            f"{path} needs {name}, which is not among the globals a fairseq checkpoint holds "
            f"({', '.join(_global_name(g) for g in ALLOWED_GLOBALS)}): refusing to unpickle it"
        ) from None
    except Exception as err:  # bytes that are no checkpoint reach torch.load's readers as any of many errors
        raise unreadable_checkpoint(path, err) from err
    if not isinstance(state, dict) or "model" not in state:
        raise ValueError(f"{path} is not a fairseq checkpoint (no 'model' state dict)")
    return state


def _global_name(obj):
    """An ALLOWED_GLOBALS entry's name: the object's, or the name a (object, name) pair gives it."""
    return obj[1] if isinstance(obj, tuple) else f"{obj.__module__}.{obj.__qualname__}"


def refused_global(err):
    """The global a weights-only UnpicklingError refuses ("a global" where torch's message does not name it), or
    None for an error about something else (bytes that are no pickle)."""
    text = str(err)
    found = re.search(r"GLOBAL ([\w.]+)", text) or re.search(r"but got <class '([\w.]+)'>", text)
    if found:
        return found.group(1)
    return "a global" if re.search(r"allowlist|unrecognized function", text) else None


def unreadable_checkpoint(path, err):
    """The ValueError for a file torch.load cannot read (err: torch's exception), saying what the file is."""
    with open(path, "rb") as handle:
        head = handle.read(64)
    if not head:
        what = f"{path} is empty, not a PyTorch checkpoint"
    elif head.startswith(GIT_LFS_POINTER):
        what = (f"{path} is a Git LFS pointer, not the PyTorch checkpoint it stands for: fetch the LFS object "
                "(`git lfs pull` in its repository) and convert the folder again")
    else:
        what = f"{path} is not a PyTorch checkpoint, or a damaged one (it starts with {head[:32]!r})"
    return ValueError(f"{what}; torch.load: {_torch_error(err)}")


def _torch_error(err):
    """torch.load's exception -> one line: its type and message (for the weights-only unpickler, the part naming what
    it found)."""
    text = str(err)
    found = re.search(r"WeightsUnpickler error:(.*?)(?:Check the documentation|$)", text, re.S)
    text = " ".join((found.group(1) if found else text).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def model_args(state):
    """The model's hyperparameters: cfg["model"] (fairseq >= 0.10) or args (older) -> dict."""
    cfg = state.get("cfg") or {}
    for args in (cfg.get("model"), state.get("args")):
        if isinstance(args, argparse.Namespace):
            return vars(args)
        if isinstance(args, dict) and args:
            return dict(args)
    raise ValueError("the checkpoint has neither cfg['model'] nor args: its architecture is unknown")


def generation_args(state):
    """fairseq-generate's decoding settings, as the checkpoint's cfg["generation"] / args override them."""
    cfg = state.get("cfg") or {}
    sources = [cfg.get("generation"), state.get("args"), cfg.get("model")]
    sources = [vars(s) if isinstance(s, argparse.Namespace) else (s or {}) for s in sources]
    found = {}
    for key, default in GENERATION_DEFAULTS.items():
        found[key] = next((s[key] for s in sources if s.get(key) is not None), default)
    return found


def architecture(args):
    """The registered fairseq architecture name (args.arch, or cfg's _name)."""
    return args.get("arch") or args.get("_name")


# ---------------------------------------------------------------------------------------------------------------
# Config


def require(args, *names):
    missing = [n for n in names if args.get(n) is None]
    if missing:
        raise ValueError(f"the checkpoint's args lack {', '.join(missing)}: cannot build the model without guessing")
    return [args[n] for n in names]


def same(args, first, second, what):
    a, b = require(args, first, second)
    if a != b:
        raise ValueError(f"{first}={a} != {second}={b}: the converted model has one {what}")
    return a


def refuse(args, name, value_ok, why):
    if not value_ok(args.get(name)):
        raise ValueError(f"{name}={args.get(name)!r} is not supported: {why}")


def _kernel_sizes(args, side):
    """args.<side>_kernel_size_list, a one-entry list repeated per layer as fairseq does -> list[int]."""
    sizes, layers = require(args, f"{side}_kernel_size_list", f"{side}_layers")
    sizes = list(sizes) * layers if len(sizes) == 1 else list(sizes)
    if len(sizes) != layers:
        raise ValueError(f"{side}_kernel_size_list has {len(sizes)} entries for {layers} layers")
    if side == "encoder" and any(k % 2 == 0 for k in sizes):
        raise ValueError(f"encoder kernel sizes {sizes} include an even size, which fairseq's encoder cannot run")
    return sizes


def derived(args):
    """The fields fairseq's base_architecture derives from others when a checkpoint lacks them (its own rule)."""
    args = dict(args)
    for key, source in [("decoder_embed_dim", "encoder_embed_dim"), ("encoder_conv_dim", "encoder_embed_dim"),
                        ("decoder_conv_dim", "decoder_embed_dim"), ("decoder_input_dim", "decoder_embed_dim"),
                        ("decoder_output_dim", "decoder_embed_dim")]:
        if args.get(key) is None:
            args[key] = args.get(source)
    return args


def check_supported(args):
    """Refuse (ValueError naming the option) what the converted model cannot compute exactly."""
    refuse(args, "encoder_learned_pos", lambda v: not v, "learned positions (fairseq's released models use sinusoids)")
    refuse(args, "decoder_learned_pos", lambda v: not v, "learned positions (fairseq's released models use sinusoids)")
    refuse(args, "no_token_positional_embeddings", lambda v: not v, "models without positions")
    refuse(args, "adaptive_softmax_cutoff", lambda v: v is None, "adaptive softmax")
    refuse(args, "weight_softmax", lambda v: v in (True, None),
            "unnormalised kernels are in no released model and untested against fairseq")
    embed = same(args, "encoder_embed_dim", "decoder_embed_dim", "d_model")
    for name in ("decoder_input_dim", "decoder_output_dim"):
        refuse(args, name, lambda v: v == embed, f"a decoder projection to/from {name}")
    return embed


def config_from_args(args, source_vocab_size, target_vocab_size):
    """fairseq model args -> DynamicConvConfig (vocab sizes from the state dict's embeddings)."""
    args = derived(args)
    d_model = check_supported(args)
    share_all = bool(args.get("share_all_embeddings"))
    tie_output = share_all or bool(args.get("share_decoder_input_output_embed"))
    encoder_heads, decoder_heads = require(args, "encoder_attention_heads", "decoder_attention_heads")
    return DynamicConvConfig(
        vocab_size=target_vocab_size,
        encoder_vocab_size=source_vocab_size,
        tie_word_embeddings=tie_output,
        tie_encoder_embeddings=share_all,
        d_model=d_model,
        conv_dim=same(args, "encoder_conv_dim", "decoder_conv_dim", "conv_dim"),
        encoder_layers=require(args, "encoder_layers")[0],
        decoder_layers=require(args, "decoder_layers")[0],
        encoder_ffn_dim=require(args, "encoder_ffn_embed_dim")[0],
        decoder_ffn_dim=require(args, "decoder_ffn_embed_dim")[0],
        encoder_conv_heads=encoder_heads,
        decoder_conv_heads=decoder_heads,
        decoder_attention_heads=decoder_heads,
        encoder_kernel_sizes=_kernel_sizes(args, "encoder"),
        decoder_kernel_sizes=_kernel_sizes(args, "decoder"),
        conv_type=same(args, "encoder_conv_type", "decoder_conv_type", "conv_type"),
        weight_softmax=True,
        encoder_glu=bool(require(args, "encoder_glu")[0]),
        decoder_glu=bool(require(args, "decoder_glu")[0]),
        encoder_normalize_before=bool(args.get("encoder_normalize_before")),
        decoder_normalize_before=bool(args.get("decoder_normalize_before")),
        activation_function="relu",
        dropout=float(args.get("dropout") or 0.0),
        attention_dropout=float(args.get("attention_dropout") or 0.0),
        activation_dropout=float(args.get("relu_dropout") or 0.0),
        input_dropout=float(args.get("input_dropout") or 0.0),
        weight_dropout=float(args.get("weight_dropout") or 0.0),
        scale_embedding=True,
        position_offset=FAIRSEQ_SPECIAL_IDS["pad_token_id"] + 1,
        decoder_start_token_id=FAIRSEQ_SPECIAL_IDS["eos_token_id"],
        **{k: v for k, v in FAIRSEQ_SPECIAL_IDS.items() if k != "unk_token_id"},
    )


# ---------------------------------------------------------------------------------------------------------------
# Weights

# fairseq name (after the layer prefix) -> talk_hf name; the released 2019 checkpoints name the encoder's norms
# layer_norms.0 / layer_norms.1 (later layer_norm1 / layer_norm2)
ENCODER_LAYER = {
    "linear1": "mixer.linear1", "linear2": "mixer.linear2", "conv.weight_linear": "mixer.weight_linear",
    "fc1": "ffn.fc1", "fc2": "ffn.fc2", "layer_norm1": "mixer_layer_norm", "layer_norm2": "final_layer_norm",
    "layer_norms.0": "mixer_layer_norm", "layer_norms.1": "final_layer_norm",
}
DECODER_LAYER = {
    "linear1": "mixer.linear1", "linear2": "mixer.linear2", "conv.weight_linear": "mixer.weight_linear",
    "fc1": "ffn.fc1", "fc2": "ffn.fc2", "conv_layer_norm": "mixer_layer_norm",
    "encoder_attn_layer_norm": "cross_attention_layer_norm", "final_layer_norm": "final_layer_norm",
    "encoder_attn.q_proj": "cross_attention.q_proj", "encoder_attn.k_proj": "cross_attention.k_proj",
    "encoder_attn.v_proj": "cross_attention.v_proj", "encoder_attn.out_proj": "cross_attention.out_proj",
}
# buffers and unused parameters fairseq saves: versions, old sinusoid tables, DynamicConv's unused conv_bias
_IGNORED = re.compile(r"(^|\.)version$|embed_positions\.(_float_tensor|weights)$|\.conv\.conv_bias$")


def split_in_proj(state):
    """Old MultiheadAttention checkpoints keep q, k, v in one in_proj_weight (3C, C) / in_proj_bias (3C,); split
    them into q_proj / k_proj / v_proj in that order, as fairseq's upgrade_state_dict_named does."""
    state = dict(state)
    for key in [k for k in state if k.endswith("in_proj_weight") or k.endswith("in_proj_bias")]:
        prefix, kind = key.rsplit(".in_proj_", 1)
        for name, part in zip(("q_proj", "k_proj", "v_proj"), state.pop(key).chunk(3, dim=0)):
            state[f"{prefix}.{name}.{kind}"] = part
    return state


def layer_key(key):
    """'encoder.layers.3.fc1.weight' -> ('encoder', 3, 'fc1', 'weight'); None for a key outside the layers."""
    match = re.fullmatch(r"(encoder|decoder)\.layers\.(\d+)\.(.+)\.(weight|bias)", key)
    return (match.group(1), int(match.group(2)), match.group(3), match.group(4)) if match else None


def rename_common(key, value):
    """The parameters every fairseq encoder-decoder has (embeddings, final norms, output matrix) -> [(talk_hf name,
    tensor)]; [] for a buffer fairseq keeps (versions, sinusoid tables); None for any other key."""
    if _IGNORED.search(key):
        return []
    simple = {
        "encoder.layer_norm.weight": "model.encoder.layer_norm.weight",
        "encoder.layer_norm.bias": "model.encoder.layer_norm.bias",
        "decoder.layer_norm.weight": "model.decoder.layer_norm.weight",
        "decoder.layer_norm.bias": "model.decoder.layer_norm.bias",
        "encoder.embed_tokens.weight": "model.encoder.embed.embed_tokens.weight",
        "decoder.output_projection.weight": "lm_head.weight",
        "decoder.embed_out": "lm_head.weight",
    }
    if key == "decoder.embed_tokens.weight":
        return [("model.decoder.embed.embed_tokens.weight", value), ("model.shared.weight", value)]
    return [(simple[key], value)] if key in simple else None


def rename_key(key, value):
    """A LightConv/DynamicConv parameter name and tensor -> [(talk_hf name, tensor)] ([] for a buffer fairseq keeps),
    None for a name with no counterpart."""
    layer = layer_key(key)
    if layer is None:
        return rename_common(key, value)
    side, i, module, kind = layer
    if module == "conv" and kind == "weight":  # LightConv kernel (H, 1, K)
        return [(f"model.{side}.layers.{i}.mixer.weight", value.reshape(value.shape[0], -1))]
    table = ENCODER_LAYER if side == "encoder" else DECODER_LAYER
    if module in table:
        return [(f"model.{side}.layers.{i}.{table[module]}.{kind}", value)]
    return None


def convert_state_dict(fairseq_state, config, rename=rename_key):
    """fairseq model state dict (time-major modules, names of any fairseq release) -> talk_hf state dict (float32),
    each key through rename(key, tensor) -> [(name, tensor)] or None. A fairseq parameter with no talk_hf counterpart
    is refused by name. Tied parameters are given once per name."""
    converted, unknown = {}, []
    for key, value in split_in_proj(fairseq_state).items():
        renamed = rename(key, value)
        if renamed is None:
            unknown.append(key)
        for name, tensor in renamed or []:
            converted[name] = tensor.float()
    if unknown:
        raise ValueError(f"fairseq parameters with no counterpart in the converted model: {', '.join(unknown)}")
    if config.tie_word_embeddings:
        converted.setdefault("lm_head.weight", converted["model.shared.weight"])
        if config.tie_encoder_embeddings:
            converted["model.encoder.embed.embed_tokens.weight"] = converted["model.shared.weight"]
    return converted


def load_weights(model, converted):
    """Load a converted state dict, every parameter of the model exactly once (missing or extra keys: ValueError)."""
    expected = set(model.state_dict())
    missing, extra = sorted(expected - set(converted)), sorted(set(converted) - expected)
    if missing or extra:
        raise ValueError(f"converted weights do not fit the model: missing {missing}, unexpected {extra}")
    model.load_state_dict(converted, strict=True)


# ---------------------------------------------------------------------------------------------------------------
# Dictionaries, tokenizer, generation config, card


def find_dictionaries(src_dir, args):
    """(source dict path, target dict path) from args.source_lang / target_lang, else the two dict.*.txt files."""
    src_dir = Path(src_dir)
    source_lang, target_lang = args.get("source_lang"), args.get("target_lang")
    if source_lang and target_lang:
        paths = [src_dir / f"dict.{source_lang}.txt", src_dir / f"dict.{target_lang}.txt"]
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            raise FileNotFoundError(f"missing fairseq dictionaries: {', '.join(missing)}")
        return paths[0], paths[1]
    raise ValueError("the checkpoint's args name no source_lang/target_lang: cannot tell the dictionaries apart")


def check_vocab_size(path, rows, side, extra=()):
    """The dictionary file `path` has one entry per embedding row but those of the `extra` symbols (not in files)."""
    size, listed = len(load_fairseq_dictionary(path)[0]), rows - len(extra)
    if size != listed:
        split = f" = {listed} dictionary entries + {' '.join(extra)} (not in the file)" if extra else ""
        raise ValueError(f"{path} has {size} entries but the checkpoint's {side} embedding has {rows} rows{split}")


def moses_languages(state):
    """The Moses languages fairseq's hub interface (``tokenizer="moses"``) uses with this checkpoint -> (source,
    target): its tokenizer section's (text_pipeline: for an args checkpoint, the released models' layout, the args'
    source_lang / target_lang), else that config's defaults, en/en. A checkpoint whose tokenizer or BPE the converted
    tokenizer would not reproduce is refused (check_text_pipeline)."""
    pipeline = text_pipeline(state)
    check_text_pipeline(pipeline)
    tokenizer = pipeline.get("tokenizer")
    if isinstance(tokenizer, dict) and tokenizer.get("source_lang"):
        return tokenizer["source_lang"], tokenizer.get("target_lang") or "en"
    return "en", "en"


MOSES_OPTIONS = ("moses_no_escape", "moses_no_dash_splits")  # fairseq's Moses options the tokenizer does not take
# The fields of fairseq's Moses and subword-nmt configs (MosesTokenizerConfig, SubwordNMTBPEConfig) that
# check_text_pipeline and moses_languages read: what a tokenizer / bpe section takes from an args Namespace
TEXT_PIPELINE_FIELDS = {"tokenizer": ("source_lang", "target_lang", *MOSES_OPTIONS), "bpe": ("bpe_separator",)}


def text_pipeline(state):
    """The checkpoint's tokenizer and BPE as fairseq loads them -> {"tokenizer": section, "bpe": section} (a section:
    a dict with the component's "_name" and options, or None). fairseq replaces the cfg of a checkpoint that has args
    by one made from the args (checkpoint_utils._upgrade_state_dict): those come from args_text_pipeline."""
    args = state.get("args")
    if args is not None:
        return args_text_pipeline(vars(args) if isinstance(args, argparse.Namespace) else dict(args))
    cfg = state.get("cfg") or {}
    return {"tokenizer": cfg.get("tokenizer"), "bpe": cfg.get("bpe")}


def args_text_pipeline(args):
    """An args dict's tokenizer and BPE in cfg's form, as fairseq's convert_namespace_to_omegaconf makes them: the
    section of the component args.tokenizer / args.bpe names, holding that component's fields from the args. The hub
    interface's tokenizer="moses" / bpe="subword_nmt" name the components of a checkpoint whose args name none, and
    the args' fields apply to them all the same: each section holds the fields whether or not args names its
    component (its "_name" is then None)."""
    return {kind: {"_name": args.get(kind), **{name: args[name] for name in fields if name in args}}
            for kind, fields in TEXT_PIPELINE_FIELDS.items()}


def check_text_pipeline(pipeline):
    """The converted tokenizer is Moses with fairseq's default options and subword-nmt with the "@@" joiner: a
    pipeline (text_pipeline's, or a cfg) whose tokenizer or BPE section asks for anything else is a ValueError naming
    it."""
    tokenizer, bpe = pipeline.get("tokenizer"), pipeline.get("bpe")
    if isinstance(tokenizer, dict):
        if tokenizer.get("_name") not in (None, "moses"):
            raise ValueError(f"the checkpoint's tokenizer is {tokenizer.get('_name')!r}: the converted tokenizer "
                             "reproduces fairseq's moses tokenizer only")
        options = [name for name in MOSES_OPTIONS if tokenizer.get(name)]
        if options:
            raise ValueError(f"the checkpoint's Moses tokenizer sets {options}: the converted tokenizer runs Moses "
                             "with fairseq's defaults (escaping, aggressive dash splits)")
    if isinstance(bpe, dict) and (bpe.get("_name") not in (None, "subword_nmt")
                                  or bpe.get("bpe_separator", "@@") != "@@"):
        raise ValueError(f"the checkpoint's BPE is {bpe.get('_name')!r} with separator "
                         f"{bpe.get('bpe_separator', '@@')!r}: the converted tokenizer applies subword-nmt codes "
                         "joined by '@@'")


def build_tokenizer(src_dir, languages, source_dict, target_dict, **special_tokens):
    """The fairseq tokenizer of the folder (Moses `languages` (source, target)); without bpecodes one for already
    tokenised, BPE'd text (warned). special_tokens: more of transformers' special tokens (RFA-doc's sep_token)."""
    codes = Path(src_dir) / "bpecodes"
    if not codes.is_file():
        logger.warning("%s has no bpecodes: the tokenizer expects text that is already tokenised and BPE'd", src_dir)
    return FairseqMosesBpeTokenizer(
        str(source_dict), str(target_dict), str(codes) if codes.is_file() else None,
        source_lang=languages[0], target_lang=languages[1], **special_tokens,
    )


def generation_config(gen, config):
    """fairseq-generate's search as a transformers GenerationConfig (see the module docstring for what differs)."""
    from transformers import GenerationConfig

    if gen["max_len_a"]:
        logger.warning("max_len_a=%s has no transformers equivalent: at most %d new tokens", gen["max_len_a"],
                       int(gen["max_len_b"]) + 1)
    if gen["unkpen"]:
        logger.warning("unkpen=%s has no transformers equivalent and is not applied", gen["unkpen"])
    return GenerationConfig(
        num_beams=int(gen["beam"]), length_penalty=float(gen["lenpen"]), early_stopping=True, do_sample=False,
        max_length=int(gen["max_len_b"]) + 2, min_length=int(gen["min_len"]) + 1,  # with the decoder start
        forced_eos_token_id=config.eos_token_id, suppress_tokens=[config.pad_token_id],
        bos_token_id=config.bos_token_id, pad_token_id=config.pad_token_id, eos_token_id=config.eos_token_id,
        decoder_start_token_id=config.decoder_start_token_id,
    )


def model_card(src_dir, title, paper, args, gen, has_bpe, details):
    """A short README.md naming the source checkpoint (`title`, the `paper` it comes from) and what the conversion
    kept (`details`: one line each)."""
    text_input = ("raw text (Moses tokenisation and subword-nmt BPE inside the tokenizer)" if has_bpe else
                  "text that is already Moses-tokenised and BPE'd (the source folder had no bpecodes)")
    return "\n".join([
        "---", "library_name: transformers", "tags: [translation, talk_hf, fairseq]", "---", "",
        f"# {title}, converted from fairseq", "",
        f"Converted by talk_hf's `convert_fairseq_checkpoint` from the fairseq checkpoint in `{Path(src_dir).name}` "
        f"({paper}).", "",
        f"- Languages: {args.get('source_lang')} -> {args.get('target_lang')}.",
        *[f"- {line}" for line in details],
        f"- Tokenizer input: {text_input}.",
        f"- Generation defaults: beam {gen['beam']}, lenpen {gen['lenpen']}, at most {int(gen['max_len_b'])} tokens "
        "before a forced </s> (fairseq-generate's; papers evaluate with other beam/lenpen per model).",
        "",
        "Load with `AutoModelForSeq2SeqLM.from_pretrained(folder)` (talk_hf imported, or `trust_remote_code=True`).",
        "What differs from fairseq: docs/converting.md in the talk_hf repository.", "",
    ])


# ---------------------------------------------------------------------------------------------------------------
# Entry point


def embedding_rows(weights):
    """(source rows, target rows) of the checkpoint's token embeddings."""
    for key in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):
        if key not in weights:
            raise ValueError(f"the checkpoint's model has no {key}")
    return tuple(weights[f"{s}.embed_tokens.weight"].shape[0] for s in ("encoder", "decoder"))


def read_dictionaries(src_dir, args, weights, extra=()):
    """The release's two dictionaries, checked against the embeddings -> (source path, target path, source rows,
    target rows); extra: the special symbols the model's dictionaries have beyond fairseq's four (not in the
    files)."""
    source_dict, target_dict = find_dictionaries(src_dir, args)
    if args.get("share_all_embeddings") and (load_fairseq_dictionary(source_dict)[0]
                                             != load_fairseq_dictionary(target_dict)[0]):
        raise ValueError(f"share_all_embeddings=True needs one dictionary for both sides, but {source_dict.name} and "
                         f"{target_dict.name} differ (fairseq refuses to build such a model)")
    source_rows, target_rows = embedding_rows(weights)
    check_vocab_size(source_dict, source_rows, "encoder", extra)
    check_vocab_size(target_dict, target_rows, "decoder", extra)
    return source_dict, target_dict, source_rows, target_rows


def check_new_folder(out_dir):
    """A converted model goes into a new (or empty) folder: files already there would mix with its own (a stale
    bpecodes would make its tokenizer BPE the input again)."""
    if out_dir.exists() and any(out_dir.iterdir()):
        raise FileExistsError(f"{out_dir} exists and is not empty: convert into a new folder")


def save_folder(model, tokenizer, out_dir, state, src_dir, title, paper, details):
    """Give the converted model the checkpoint's decoding settings and write it, its tokenizer and its card
    (README.md: `title`, `paper`, `details` lines) to out_dir -> out_dir (Path)."""
    args, gen = model_args(state), generation_args(state)
    model.generation_config = generation_config(gen, model.config)
    card = model_card(src_dir, title, paper, args, gen, tokenizer.bpe is not None, details)
    out_dir = Path(out_dir)
    check_new_folder(out_dir)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "README.md").write_text(card, encoding="utf-8")
    return out_dir


def convert_lightconv(state, src_dir, out_dir, arch):
    """A LightConv/DynamicConv checkpoint (already loaded) -> a save_pretrained folder at out_dir."""
    from .modeling_dynamic_conv import DynamicConvForConditionalGeneration

    args = model_args(state)
    weights = state["model"]
    source_dict, target_dict, source_rows, target_rows = read_dictionaries(src_dir, args, weights)
    config = config_from_args(args, source_rows, target_rows)
    model = DynamicConvForConditionalGeneration(config)
    load_weights(model, convert_state_dict(weights, config))
    tokenizer = build_tokenizer(src_dir, moses_languages(state), source_dict, target_dict)
    kind = "LightConv" if config.conv_type == "lightweight" else "DynamicConv"
    details = [
        f"Vocabularies {config.encoder_vocab_size or config.vocab_size} (source) / {config.vocab_size} (target).",
        f"{config.encoder_layers} encoder and {config.decoder_layers} decoder layers, d_model {config.d_model}, "
        f"GLU encoder/decoder {config.encoder_glu}/{config.decoder_glu}, kernels {config.encoder_kernel_sizes} / "
        f"{config.decoder_kernel_sizes}.",
    ]
    return save_folder(model, tokenizer, out_dir, state, src_dir, f"{kind} ({arch})", "Wu et al., 2019, *Pay Less "
                       "Attention with Lightweight and Dynamic Convolutions*", details)


def convert_fairseq_checkpoint(src_dir, out_dir):
    """Convert the fairseq release folder src_dir (model.pt, dict.<src>.txt, dict.<tgt>.txt[, bpecodes]) into a
    save_pretrained folder out_dir: a LightConv/DynamicConv (fairseq), RFA-doc (rfa-doc-mt) or TaLK
    (TaLKConvolutions) translation model. Raises ValueError for an architecture it does not convert (naming it), for
    unsupported options and for a checkpoint whose pickle names a global outside ALLOWED_GLOBALS -> out_dir (Path)."""
    from . import convert_fairseq_rfa, convert_fairseq_talk

    src_dir, out_dir = Path(src_dir), Path(out_dir)
    check_new_folder(out_dir)
    state = load_checkpoint(src_dir / "model.pt")
    arch = architecture(model_args(state))
    if arch in LIGHTCONV_ARCHS:
        return convert_lightconv(state, src_dir, out_dir, arch)
    elif arch in convert_fairseq_rfa.RFA_ARCHS:
        return convert_fairseq_rfa.convert_rfa_doc(state, src_dir, out_dir, arch)
    elif arch in convert_fairseq_talk.TALK_ARCHS:
        return convert_fairseq_talk.convert_talk(state, src_dir, out_dir, arch)
    refused = {**convert_fairseq_rfa.REFUSED_ARCHS, **convert_fairseq_talk.REFUSED_ARCHS}
    if arch in refused:
        raise ValueError(f"cannot convert fairseq architecture {arch!r}: {refused[arch]}")
    supported = LIGHTCONV_ARCHS + convert_fairseq_rfa.RFA_ARCHS + convert_fairseq_talk.TALK_ARCHS
    raise ValueError(f"cannot convert fairseq architecture {arch!r}: supported are {', '.join(supported)}")
