#!/usr/bin/env python
"""Evaluate a saved model: sacreBLEU (printed with its signature), ROUGE for summaries, perplexity for LMs.

    python scripts/evaluate_model.py --model runs/demo/talk/model --data runs/demo/data --split test  # BLEU
    python scripts/evaluate_model.py --model M --source test.de --reference test.en --num_beams 5 --length_penalty 1.6
    python scripts/evaluate_model.py --model M --data D --split test --document_level               # whole documents
    python scripts/evaluate_model.py --model M --source articles.txt --reference summaries.txt --metric rouge
    python scripts/evaluate_model.py --model LM --data D --split test --metric perplexity
    python scripts/evaluate_model.py --model M --data D --split valid --metric loss     # does it read its source?
"""

import argparse
import json
import sys
from pathlib import Path

from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

import talk_hf  # noqa: F401
from talk_hf.training.corpora import read_lines, write_lines
from talk_hf.training.evaluation import perplexity, rouge, translate
from talk_hf.training.loop import make_collator, summed_losses, validation_loss
from talk_hf.training.run import evaluate_translation, load_prepared


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="saved model folder or Hub repo id")
    parser.add_argument("--data", help="folder written by scripts/preprocess.py")
    parser.add_argument("--split", default="test")
    parser.add_argument("--source", help="raw source file, one segment per line (.gz fine)")
    parser.add_argument("--reference", help="raw reference file aligned with --source")
    parser.add_argument("--metric", choices=["bleu", "rouge", "perplexity", "loss"], default="bleu",
                        help="loss: a translation model's loss on a prepared split and its source gain (the loss "
                             "with every source swapped for another sentence's minus that loss; about 0 for an "
                             "encoder that no longer reads its input)")
    parser.add_argument("--document_level", action="store_true",
                        help="the split holds document windows: translate its documents whole, score every sentence")
    parser.add_argument("--document_decoding", choices=["sliding", "streaming", "windows"], default=None,
                        help="with --document_level: sliding windows with the forced target context (the paper's; "
                             "the default), the decoder state carried across each document (greedy), or each window "
                             "on its own (last sentence)")
    parser.add_argument("--num_beams", type=int, help="default: the model's generation_config (4 if unset); 1 with "
                                                      "--document_decoding streaming, which takes no other")
    parser.add_argument("--length_penalty", type=float, help="default: the model's generation_config")
    parser.add_argument("--max_new_tokens", type=int, help="default: the model's generation_config (128 if unset)")
    parser.add_argument("--max_tokens", type=int, default=8192, help="token budget per batch (perplexity, loss)")
    parser.add_argument("--limit", type=int, default=0,
                        help="score only the first N segments, or examples of a prepared split (0: all)")
    parser.add_argument("--trust_remote_code", action="store_true")
    parser.add_argument("--output", help="write the results as JSON here")
    parser.add_argument("--hypotheses", help="write the translations here, one per line (BLEU)")
    args = parser.parse_args(argv)
    if (args.data is None) == (args.source is None):
        parser.error("give either --data (prepared) or --source/--reference (raw files)")
    if args.source and not args.reference:
        parser.error("--source needs --reference")
    if args.reference and not args.source:
        parser.error("--reference needs --source")
    if args.limit < 0:
        parser.error(f"--limit must be >= 0, got {args.limit}")
    if args.metric in ("perplexity", "loss") and args.data is None:
        parser.error(f"--metric {args.metric} needs --data with a prepared split")
    if args.metric == "rouge" and args.source is None:
        parser.error("--metric rouge needs --source and --reference (raw files)")
    if args.document_level and args.data is None:
        parser.error("--document_level needs --data: a prepared split of document windows (with doc_id)")
    if args.document_level and args.metric != "bleu":
        parser.error(f"--document_level scores translations (--metric bleu), not --metric {args.metric}")
    if args.document_decoding is not None and not args.document_level:
        parser.error("--document_decoding applies to --document_level evaluation only (add --document_level)")
    if args.document_decoding == "streaming" and args.num_beams not in (None, 1):
        parser.error(f"--document_decoding streaming carries one decoder state (greedy): --num_beams must be 1, got "
                     f"{args.num_beams}")
    return args


def read_pairs(source, reference):
    """The lines of the --source and --reference files, which must have as many lines as each other."""
    sources, references = read_lines(source), read_lines(reference)
    if len(sources) != len(references):
        raise SystemExit(f"line counts differ: --source {source} has {len(sources)} lines, --reference {reference} "
                         f"has {len(references)} lines (line i of one must match line i of the other)")
    return sources, references


def first(rows, limit):
    """The first `limit` rows of a list or a Dataset (all of them for limit 0)."""
    if not limit:
        return rows
    return rows.select(range(min(limit, len(rows)))) if hasattr(rows, "select") else rows[:limit]


def generation_settings(generation_config, args):
    """Beam size, length penalty and new-token limit: the command line's, else those the model was saved with (a
    training run saves the ones its reported BLEU used; a saved max_length, as converted fairseq models have, counts
    the decoder start), else 4 beams and 128 tokens; streaming document decoding (`--document_decoding streaming`,
    greedy) takes 1 beam."""
    saved = generation_config.to_diff_dict()  # the values set in the model's generation_config.json, not defaults

    def pick(name, fallback):
        given = getattr(args, name)
        return given if given is not None else saved.get(name, fallback)

    streaming = getattr(args, "document_decoding", None) == "streaming"
    return {"num_beams": 1 if streaming else pick("num_beams", 4), "length_penalty": pick("length_penalty", 1.0),
            "max_new_tokens": pick("max_new_tokens", saved["max_length"] - 1 if "max_length" in saved else 128)}


def check_model_kind(args, config):
    """Perplexity is a causal language model's metric, the others an encoder-decoder's."""
    lm_metric = args.metric == "perplexity"
    if lm_metric == bool(config.is_encoder_decoder):
        kind = "an encoder-decoder" if config.is_encoder_decoder else "a causal language model"
        fits = "bleu, rouge or loss" if config.is_encoder_decoder else "perplexity"
        raise SystemExit(f"--model {args.model} is {kind} ({config.model_type}): --metric {args.metric} does not "
                         f"apply to it; use --metric {fits}")


def check_tokenizer(args, tokenizer):
    """Loss and perplexity score the prepared ids of --data: they must be the ids of the model's vocabulary."""
    prepared = AutoTokenizer.from_pretrained(Path(args.data) / "tokenizer")
    if prepared.get_vocab() != tokenizer.get_vocab():
        raise SystemExit(f"--data {args.data} was prepared with another tokenizer than --model {args.model}'s: its "
                         f"ids would be scored as other tokens (prepare it with scripts/preprocess.py --tokenizer "
                         f"{args.model})")


def main(argv=None):
    args = parse_args(argv)
    raw = read_pairs(args.source, args.reference) if args.source else None
    kw = {"trust_remote_code": args.trust_remote_code}
    check_model_kind(args, AutoConfig.from_pretrained(args.model, **kw))
    tokenizer = AutoTokenizer.from_pretrained(args.model, **kw)
    if args.metric in ("perplexity", "loss"):
        check_tokenizer(args, tokenizer)
    auto = AutoModelForCausalLM if args.metric == "perplexity" else AutoModelForSeq2SeqLM
    model = auto.from_pretrained(args.model, **kw).eval()
    generation = generation_settings(model.generation_config, args)
    if args.metric == "perplexity":
        loss, tokens = validation_loss(model, first(load_prepared(args.data, args.split), args.limit),
                                       make_collator(model), args.max_tokens)
        results = {"loss": loss, "perplexity": perplexity(loss), "tokens": tokens}
    elif args.metric == "loss":
        sums = summed_losses(model, first(load_prepared(args.data, args.split), args.limit), make_collator(model),
                             args.max_tokens, swap_sources=True)
        results = {"loss": sums.loss, "tokens": sums.tokens, "source_gain": sums.source_gain,
                   "source_gain_tokens": sums.gain_tokens}
    elif args.metric == "rouge":
        sources, references = (first(lines, args.limit) for lines in raw)
        results = rouge(translate(model, tokenizer, sources, **generation), references)
    else:
        if args.data:
            dataset = load_prepared(args.data, args.split)
        else:
            dataset = {"source": raw[0], "target": raw[1]}
        results = evaluate_translation(model, tokenizer, dataset, **generation,
                                       document_level=args.document_level, limit=args.limit,
                                       document_decoding=args.document_decoding or "sliding")
        results["generation"] = generation
        hypotheses = results.pop("hypotheses")
        if args.hypotheses:
            write_lines(args.hypotheses, hypotheses)
        print(results["signature"])
    print(json.dumps(results, indent=2))
    if args.output:
        Path(args.output).write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except (ValueError, FileNotFoundError) as err:  # a missing split or file, text that is not UTF-8 ...
        sys.exit(f"evaluate_model.py: error: {err}")
