"""Joint BPE tokenizers for the TaLK / DynamicConv / RFA-doc models, as transformers 5 fast tokenizers.

A flat module (only ``tokenizers``/``transformers`` imports) so that it can be copied next to a checkpoint.

Special tokens and ids are fixed, so every checkpoint config can use the same numbers::

    <s>=0 (bos)   <pad>=1   </s>=2 (eos)   <unk>=3   <sep>=4 (sentence separator in document windows)

The tokenizer: NFKC normaliser (then every run of whitespace, tabs and line breaks included, made one space, whitespace
stripped at both ends of each piece between special tokens, and lowercasing on request), Metaspace pre-tokenizer/decoder (``▁`` marks a word start), BPE trained on source and target
text together (joint vocabulary), wrapped in ``transformers.PreTrainedTokenizerFast`` (an alias of
``TokenizersBackend`` in transformers 5). The post-processor appends ``</s>`` for translation and appends nothing
for language modelling.

Document windows are plain strings with sentences separated by ``" <sep> "``::

    window = join_sentences(["Ein Hund rennt.", "Er bellt."])    # "Ein Hund rennt. <sep> Er bellt."
    ids = tok(window)["input_ids"]                                # ... 4 ... 2   (<sep> is one token, id 4)
    split_sentences(tok.decode(ids), tok.sep_token)               # ["Ein Hund rennt.", "Er bellt."]
"""

import re
from collections.abc import Iterable

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

BOS_TOKEN, PAD_TOKEN, EOS_TOKEN, UNK_TOKEN, SEP_TOKEN = "<s>", "<pad>", "</s>", "<unk>", "<sep>"
SPECIAL_TOKENS = [BOS_TOKEN, PAD_TOKEN, EOS_TOKEN, UNK_TOKEN, SEP_TOKEN]  # ids 0..4, in this order
BOS_ID, PAD_ID, EOS_ID, UNK_ID, SEP_ID = range(len(SPECIAL_TOKENS))
MIN_VOCAB_SIZE = len(SPECIAL_TOKENS) + 1  # the special tokens and at least one learned token
LINE_BREAK = re.compile(r"\r\n|\r|\n")  # the line breaks of text read as lines (universal newlines)


def _special_added_tokens() -> list[AddedToken]:
    """The 5 special tokens, matched on the raw text (``normalized=False``), never split, skipped by decode."""
    return [AddedToken(t, normalized=False, special=True) for t in SPECIAL_TOKENS]


def _normalizer(lowercase: bool) -> normalizers.Normalizer:
    """NFKC, then each run of whitespace (tabs and line breaks included) made one space and leading/trailing
    whitespace stripped, then lowercasing when ``lowercase`` is True.

    Special tokens are cut out of the text before normalisation, so the strip applies to each piece between them:
    ``"a <sep> b"`` becomes ``"a"``, ``<sep>``, ``"b"`` and the space before ``<sep>`` does not turn into a lone
    ``▁`` token. (``AddedToken(lstrip=True, rstrip=True)`` would do the same for the ids, but then ``tokenize()``
    returns ``" <sep> "``, which ``convert_tokens_to_ids`` maps to ``<unk>``.)
    """
    steps = [normalizers.NFKC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Strip()]
    if lowercase:
        steps.append(normalizers.Lowercase())
    return normalizers.Sequence(steps)


def _train_backend(texts: Iterable[str], vocab_size: int, lowercase: bool, min_frequency: int) -> Tokenizer:
    """A trained ``tokenizers.Tokenizer`` (BPE, normaliser, Metaspace pre-tokenizer and decoder), no post-processor.

    The special tokens are passed to the trainer first, so they get ids 0..4.
    """
    backend = Tokenizer(models.BPE(unk_token=UNK_TOKEN, fuse_unk=True))
    backend.normalizer = _normalizer(lowercase)
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=_special_added_tokens(), show_progress=False
    )
    backend.train_from_iterator(texts, trainer=trainer)
    ids = [backend.token_to_id(t) for t in SPECIAL_TOKENS]
    if ids != list(range(len(SPECIAL_TOKENS))):
        raise RuntimeError(f"special tokens got ids {ids}, expected 0..{len(SPECIAL_TOKENS) - 1}")
    if backend.get_vocab_size() == len(SPECIAL_TOKENS):
        raise ValueError("the tokenizer learned no token: texts held no text (every input would encode to <unk>)")
    return backend


def train_joint_bpe(
    texts: Iterable[str],
    vocab_size: int,
    *,
    lowercase: bool = False,
    add_eos: bool = True,
    add_bos: bool = False,
    model_max_length: int = 1024,
    min_frequency: int = 2,
) -> PreTrainedTokenizerFast:
    """Train a joint BPE vocabulary and wrap it as a transformers fast tokenizer.

    Args:
        texts: iterable of str, one sentence (or document window) per item; pass the source and the target side
            together for a joint vocabulary. Consumed once.
        vocab_size: int >= ``MIN_VOCAB_SIZE`` (6), the target vocabulary size including the 5 special tokens (the
            result can be smaller when the corpus has too few mergeable pairs, and larger when the corpus has more
            distinct characters: every character gets a token).
        lowercase: also lowercase after NFKC.
        add_eos: True (translation): every encoded sequence, source and ``text_target`` labels alike, ends in
            ``</s>`` (id 2). False (language model): no ``</s>`` is appended, so a prompt does not end in EOS.
        add_bos: prepend ``<s>`` (id 0) to every encoded sequence (e.g. an LM that starts from ``<s>``).
        model_max_length: int, stored as ``tok.model_max_length``.
        min_frequency: int, minimum pair count for a BPE merge.

    Returns:
        ``PreTrainedTokenizerFast`` with bos/pad/eos/unk/sep ids 0/1/2/3/4. ``tok(src, text_target=tgt,
        max_length=L, truncation=True)`` gives lists of ids ``input_ids``/``attention_mask``/``labels``, each
        sequence at most ``L`` long including the appended ``</s>``.

    Raises:
        TypeError: ``texts`` is one ``str``.
        ValueError: ``vocab_size`` is not an int >= ``MIN_VOCAB_SIZE``, or ``texts`` held no text.

    Note:
        After ``AutoTokenizer.from_pretrained`` the ``add_bos_token``/``add_eos_token`` attributes read False
        whatever the saved post-processor does (transformers 5.23 does not save them). Do not assign them on a
        loaded tokenizer: the setter rebuilds the template from both flags, e.g. ``tok.add_bos_token = True`` on a
        reloaded translation tokenizer silently stops appending ``</s>``.
    """
    if isinstance(texts, str):
        raise TypeError("texts must be an iterable of sentences, not one str (iterated, a str gives its characters); "
                        "pass text.splitlines() for one sentence per line")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(f"vocab_size must be an int >= {MIN_VOCAB_SIZE} (the {len(SPECIAL_TOKENS)} special tokens "
                         f"and at least one more), got {vocab_size!r}")
    backend = _train_backend(texts, vocab_size, lowercase, min_frequency)
    # add_bos_token/add_eos_token make transformers build the TemplateProcessing post-processor (e.g. "$A:0 </s>:0"),
    # which is saved in tokenizer.json. transformers 5.23 does NOT save the two flags in tokenizer_config.json: a
    # reloaded tokenizer still appends </s> (the template is the source of truth) but reports add_eos_token=False,
    # and assigning tok.add_bos_token/tok.add_eos_token there rebuilds the template from those flags.
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS_TOKEN,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        sep_token=SEP_TOKEN,
        add_bos_token=add_bos,
        add_eos_token=add_eos,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )


def token_id(tokenizer, token: str) -> int | None:
    """The id of ``token`` in the tokenizer's vocabulary, or None when it has none (unknown tokens map to unk)."""
    ids = tokenizer.convert_tokens_to_ids([token])
    return None if not ids or ids[0] is None or ids[0] == tokenizer.unk_token_id else ids[0]


def document_separator(tokenizer, sep_token: str | None = None) -> str:
    """The token that joins the sentences of a document window for ``tokenizer``: ``sep_token`` when given, else the
    tokenizer's own ``sep_token`` (``"<sep>"`` for the joint BPE tokenizers, ``"[@@SEP@@]"`` for converted rfa-doc-mt
    ones) unless it is the end-of-sequence token (BART's, mBART's, NLLB's ``"</s>"``, which ends a translation and
    cannot join two), else ``SEP_TOKEN``."""
    if sep_token is not None:
        return sep_token
    own = getattr(tokenizer, "sep_token", None)
    return own if own is not None and own != getattr(tokenizer, "eos_token", None) else SEP_TOKEN


def join_sentences(sentences: Iterable[str], sep_token: str = SEP_TOKEN) -> str:
    """One document window as a string: the stripped sentences joined by ``" <sep> "``.

    Args:
        sentences: iterable of str (consecutive sentences of one document).
        sep_token: the separator token string.

    Returns:
        str, e.g. ``"A dog runs. <sep> It barks."``; an empty iterable gives ``""``.
    """
    return f" {sep_token} ".join(s.strip() for s in sentences)


def split_sentences(text: str, sep_token: str = SEP_TOKEN) -> list[str]:
    """Inverse of :func:`join_sentences` on decoded text.

    Decode with ``skip_special_tokens=False`` (otherwise the separators are gone); ``<s>``, ``</s>``, ``<pad>`` and
    ``<unk>`` left in the text are removed here, as ``skip_special_tokens=True`` would remove them.

    Args:
        text: str, e.g. ``tok.decode(ids)``.
        sep_token: the separator token string.

    Returns:
        list of str, the stripped sentences (``[]`` for an empty window).
    """
    for special in (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, UNK_TOKEN):
        if special != sep_token:
            text = text.replace(special, " ")
    if not text.strip():
        return []
    return [part.strip() for part in text.split(sep_token)]
