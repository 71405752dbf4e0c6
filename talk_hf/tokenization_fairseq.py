"""fairseq's text pipeline for converted fairseq translation models, as a transformers (Python) tokenizer.

A flat module (only ``transformers``, ``sacremoses`` and ``subword_nmt`` imports) so that it can be copied next to a
checkpoint and loaded as remote code. It needs ``sacremoses`` and ``subword-nmt`` (``pip install sacremoses
subword-nmt``; with talk_hf, its ``fairseq`` extra).

Encoding a source sentence does what fairseq's hub interface does (``tokenizer=moses``, ``bpe=subword_nmt``)::

    Moses tokenisation (source language, aggressive dash splits, escaping)
    -> subword-nmt BPE ("@@ " joiners)  -> ids in the source dictionary  -> + </s>

Decoding ids of the target dictionary drops <s>, <pad> and </s> (an <unk> stays "<unk>", as fairseq prints it),
joins the tokens, removes the "@@ " joiners and Moses-detokenises (target language). Encoding ``text_target`` uses the
target dictionary and language. Without BPE codes (``bpe_codes_file=None``) the tokenizer expects text that is already
tokenised and BPE'd: it splits on whitespace, and decoding removes the joiners but does not detokenise.

Dictionaries are fairseq's ``dict.<lang>.txt`` files: ids 0..3 are ``<s> <pad> </s> <unk>``, then one entry per line
("word count", optionally followed by ``#fairseq:overwrite``), including the ``madeupword`` fillers that pad a
dictionary to a multiple of 8 when the file has them.
"""

import os
import re
import shutil

from transformers import PreTrainedTokenizer

BOS_TOKEN, PAD_TOKEN, EOS_TOKEN, UNK_TOKEN = "<s>", "<pad>", "</s>", "<unk>"
SPECIAL_TOKENS = [BOS_TOKEN, PAD_TOKEN, EOS_TOKEN, UNK_TOKEN]  # fairseq's Dictionary: ids 0..3
OVERWRITE_FLAG = "#fairseq:overwrite"
VOCAB_FILES_NAMES = {
    "source_dict_file": "dict.source.txt",
    "target_dict_file": "dict.target.txt",
    "bpe_codes_file": "bpecodes",
}
BPE_JOINER = "@@ "


def _parse_dict_line(line, path, number):
    """One line of a fairseq dictionary -> (word, overwrite), by fairseq's Dictionary.add_from_file rule: the line
    without its trailing whitespace splits at its last space into the word and the count (after the
    ``#fairseq:overwrite`` flag, when that is the last field), and the count is what int() reads."""
    fields = line.rstrip().rsplit(" ", 1)
    overwrite = len(fields) == 2 and fields[1] == OVERWRITE_FLAG
    if overwrite:
        fields = fields[0].rsplit(" ", 1)
    if len(fields) != 2 or not _is_count(fields[1]):
        raise ValueError(f"{path}, line {number}: expected '<token> <count> [{OVERWRITE_FLAG}]', got {line!r}")
    return fields[0], overwrite


def _is_count(text):
    """Whether int() reads text (fairseq's count rule: signs, surrounding whitespace and digit underscores pass)."""
    try:
        int(text)
    except ValueError:
        return False
    return True


def load_fairseq_dictionary(path):
    """A fairseq ``dict.txt`` -> (symbols, indices): every id's token (ids 0..3 ``<s> <pad> </s> <unk>``, then the
    file's entries from id 4 in order; its length is the dictionary's size) and {token: id}. A repeated token is an
    error unless its line carries ``#fairseq:overwrite``; then, as fairseq's ``add_symbol(overwrite=True)``, it takes
    a new id, and its earlier id keeps its place. Overwriting one of the four special tokens is an error: fairseq
    keeps its id for the model (``eos_index``) and gives its text the new one."""
    symbols = list(SPECIAL_TOKENS)
    indices = {token: i for i, token in enumerate(symbols)}
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            word, overwrite = _parse_dict_line(line, path, number)
            if word in indices and not overwrite:
                raise ValueError(f"{path}, line {number}: duplicate token {word!r} (without {OVERWRITE_FLAG})")
            if word in SPECIAL_TOKENS:
                raise ValueError(
                    f"{path}, line {number}: {word!r} overwrites a special token: fairseq then encodes the text "
                    f"{word!r} as id {len(symbols)} but keeps id {SPECIAL_TOKENS.index(word)} as the model's "
                    f"{word!r}, which one tokenizer token cannot be; remove the line")
            indices[word] = len(symbols)
            symbols.append(word)
    return symbols, indices


def _moses():
    try:
        import sacremoses
    except ImportError as err:
        raise ImportError("the fairseq tokenizer needs sacremoses: pip install sacremoses") from err
    return sacremoses


def _subword_nmt_bpe(codes_file):
    """subword-nmt's BPE as fairseq builds it (``--codes FILE --separator @@``, no vocabulary, no glossaries)."""
    try:
        from subword_nmt.apply_bpe import BPE
    except ImportError as err:
        raise ImportError("the fairseq tokenizer needs subword-nmt: pip install subword-nmt") from err
    with open(codes_file, encoding="utf-8") as codes:
        return BPE(codes, -1, BPE_JOINER.strip(), None, None)


def remove_bpe(text):
    """fairseq's subword_nmt decode: "Wie@@ der@@ sehen" -> "Wiedersehen"."""
    return (text + " ").replace(BPE_JOINER, "").rstrip()


class FairseqMosesBpeTokenizer(PreTrainedTokenizer):
    """fairseq's Moses + subword-nmt pipeline with separate source and target dictionaries (as transformers'
    FSMTTokenizer keeps them): text is encoded with the source dictionary (the target's for ``text_target``) and ids
    are decoded with the target dictionary. Tokens added with ``add_tokens`` take ids past both dictionaries' and
    encode and decode as themselves on both sides.

    Args:
        source_dict_file / target_dict_file (`str`): fairseq dictionaries (``dict.<lang>.txt``).
        bpe_codes_file (`str`, optional): subword-nmt codes; None: input is already tokenised and BPE'd.
        source_lang / target_lang (`str`): Moses languages of the two sides.
    """

    vocab_files_names = VOCAB_FILES_NAMES
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(
        self,
        source_dict_file,
        target_dict_file,
        bpe_codes_file=None,
        source_lang="en",
        target_lang="en",
        bos_token=BOS_TOKEN,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        **kwargs,
    ):
        self.source_dict_file, self.target_dict_file = source_dict_file, target_dict_file
        self.bpe_codes_file = bpe_codes_file
        self.source_lang, self.target_lang = source_lang, target_lang
        self.source_symbols, self.source_vocab = load_fairseq_dictionary(source_dict_file)
        target_symbols, self.target_vocab = load_fairseq_dictionary(target_dict_file)
        self.target_tokens = dict(enumerate(target_symbols))
        self.bpe = _subword_nmt_bpe(bpe_codes_file) if bpe_codes_file else None
        self._moses_tokenizers, self._moses_detokenizer = {}, None
        self.encoder, self.lang = self.source_vocab, source_lang
        self._reserved_ids = {}  # the ids of the tokens _add_tokens is adding
        kwargs.setdefault("clean_up_tokenization_spaces", False)
        super().__init__(
            source_lang=source_lang, target_lang=target_lang, bos_token=bos_token, pad_token=pad_token,
            eos_token=eos_token, unk_token=unk_token, **kwargs,
        )

    @property
    def vocab_size(self):
        """The source dictionary's size (as FSMTTokenizer: the encoder's vocabulary)."""
        return len(self.source_symbols)

    def get_vocab(self):
        """The source dictionary's tokens and the added tokens -> {token: id}."""
        return {**self.source_vocab, **self.added_tokens_encoder, **self._reserved_ids}

    def _next_free_id(self):
        """The first id past both dictionaries' ids and the added tokens' ids."""
        return max(len(self.source_symbols), len(self.target_tokens), *(i + 1 for i in self._added_tokens_decoder))

    def _update_total_vocab_size(self):
        """len(tokenizer): the first id past both dictionaries and the added tokens (the ids, not the distinct
        tokens: an entry overwritten with #fairseq:overwrite keeps its earlier id)."""
        self.total_vocab_size = self._next_free_id()

    def _add_tokens(self, new_tokens, special_tokens=False):
        """transformers' _add_tokens with the new tokens numbered from _next_free_id() -> how many are new.
        transformers numbers them from len(get_vocab()), the number of distinct tokens, which is short of that id
        when a dictionary entry was overwritten or the target dictionary (whose ids decoding reads) is the larger:
        get_vocab() holds the new tokens at their ids while transformers adds them, as it adds tokens of the
        vocabulary."""
        vocab = self.get_vocab()
        new = dict.fromkeys(str(t) for t in new_tokens or [] if str(t) and str(t) not in vocab)
        first = self._next_free_id()
        self._reserved_ids = {token: first + i for i, token in enumerate(new)}
        try:
            super()._add_tokens(new_tokens, special_tokens=special_tokens)
        finally:
            self._reserved_ids = {}
        return len(new)

    def _switch_to_target_mode(self):
        self.encoder, self.lang = self.target_vocab, self.target_lang

    def _switch_to_input_mode(self):
        self.encoder, self.lang = self.source_vocab, self.source_lang

    def moses_tokenize(self, text, lang):
        """fairseq's moses encoder: text -> space-separated tokens."""
        if lang not in self._moses_tokenizers:
            self._moses_tokenizers[lang] = _moses().MosesTokenizer(lang=lang)
        return self._moses_tokenizers[lang].tokenize(text, aggressive_dash_splits=True, return_str=True, escape=True)

    def moses_detokenize(self, text):
        """fairseq's moses decoder (target language): space-separated tokens -> text."""
        if self._moses_detokenizer is None:
            self._moses_detokenizer = _moses().MosesDetokenizer(lang=self.target_lang)
        return self._moses_detokenizer.detokenize(text.split())

    def tokenize(self, text, **kwargs):
        """fairseq's encode_line on raw text: Moses and BPE over all of it (a "</s>" or "<unk>" written in the text
        is text, which Moses escapes, as fairseq does); a document model's separator (sep_token) and tokens added
        with `add_tokens` or as special tokens (a language tag) are kept whole between the parts around them;
        `split_special_tokens` (the call's, else the tokenizer's) makes the special ones text too."""
        fairseq_specials = {self.bos_token, self.pad_token, self.eos_token, self.unk_token}
        whole = set(self.added_tokens_encoder) - fairseq_specials  # the separator, when added, is one of them
        whole |= {self.special_tokens_map["sep_token"]} if self.special_tokens_map.get("sep_token") else set()
        if kwargs.get("split_special_tokens", self.split_special_tokens):
            whole = {t for t in whole if not self._added_tokens_decoder[self.added_tokens_encoder[t]].special}
        if not whole:
            return self._tokenize(text)
        pattern = "(" + "|".join(re.escape(t) for t in sorted(whole, key=len, reverse=True)) + ")"
        parts = re.split(pattern, text)  # text, a kept token, text, ...
        return [t for i, part in enumerate(parts) for t in ([part] if i % 2 else self._tokenize(part))]

    def _tokenize(self, text, **kwargs):
        """text -> BPE pieces ("Wie@@", "der@@", "sehen")."""
        if self.bpe is not None:
            text = self.bpe.process_line(self.moses_tokenize(text, self.lang))
        return text.split()

    def _convert_token_to_id(self, token):
        return self.encoder.get(token, self.encoder[UNK_TOKEN])

    def _convert_id_to_token(self, index):
        return self.target_tokens.get(index, UNK_TOKEN)

    def convert_tokens_to_string(self, tokens):
        """Target tokens -> text: joiners removed, then Moses-detokenised (when the tokenizer has BPE codes)."""
        text = remove_bpe(" ".join(tokens))
        return self.moses_detokenize(text) if self.bpe is not None else text

    def _decode(self, token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=None, **kwargs):
        """Target ids -> text. skip_special_tokens drops <s>, <pad>, </s>, a document model's separator and tokens
        added as special but keeps <unk> (fairseq's Dictionary.string prints it; rfa-doc-mt's drops the separator)."""
        token_ids = [token_ids] if isinstance(token_ids, int) else list(token_ids)
        skipped = set(self.all_special_ids) - {self.unk_token_id} if skip_special_tokens else set()
        return self.convert_tokens_to_string(self.convert_ids_to_tokens([i for i in token_ids if i not in skipped]))

    def build_inputs_with_special_tokens(self, token_ids_0, token_ids_1=None):
        """fairseq's encode_line: the ids then </s> (no <s>)."""
        if token_ids_1 is not None:
            raise ValueError("fairseq translation models take one sequence, not a pair")
        return token_ids_0 + [self.eos_token_id]

    def get_special_tokens_mask(self, token_ids_0, token_ids_1=None, already_has_special_tokens=False):
        if already_has_special_tokens:
            return [int(i in (self.bos_token_id, self.pad_token_id, self.eos_token_id)) for i in token_ids_0]
        return [0] * len(token_ids_0) + [1]

    def save_vocabulary(self, save_directory, filename_prefix=None):
        """Copies the two dictionaries (and the BPE codes) into save_directory -> the paths written."""
        prefix = f"{filename_prefix}-" if filename_prefix else ""
        sources = {"source_dict_file": self.source_dict_file, "target_dict_file": self.target_dict_file}
        if self.bpe_codes_file:
            sources["bpe_codes_file"] = self.bpe_codes_file
        written = []
        for key, source in sources.items():
            target = os.path.join(save_directory, prefix + VOCAB_FILES_NAMES[key])
            if os.path.abspath(source) != os.path.abspath(target):
                shutil.copyfile(source, target)
            written.append(target)
        return tuple(written)
