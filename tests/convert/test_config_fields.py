"""The DynamicConvConfig fields converted fairseq models need (talk_hf/convert_fairseq.py): a source vocabulary of
its own, the encoder's embedding untied, positions counted from an offset. Their defaults leave every model as
before."""

import pytest
import torch

from talk_hf import DynamicConvConfig, DynamicConvForConditionalGeneration

TINY = dict(d_model=16, encoder_layers=1, decoder_layers=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
            encoder_conv_heads=2, decoder_conv_heads=2, decoder_attention_heads=2, encoder_kernel_sizes=[3],
            decoder_kernel_sizes=[3, 5], vocab_size=40)


def test_defaults_keep_the_shared_embedding_and_positions_from_zero():
    config = DynamicConvConfig()
    assert (config.encoder_vocab_size, config.tie_encoder_embeddings, config.position_offset) == (None, True, 0)
    model = DynamicConvForConditionalGeneration(DynamicConvConfig(**TINY))
    assert model.model.encoder.embed_tokens.weight is model.model.shared.weight is model.lm_head.weight


def test_a_source_vocabulary_of_its_own(tmp_path):
    config = DynamicConvConfig(**TINY, encoder_vocab_size=24, tie_encoder_embeddings=False)
    model = DynamicConvForConditionalGeneration(config)
    encoder, shared = model.model.encoder.embed_tokens.weight, model.model.shared.weight
    assert encoder.shape == (24, 16) and shared.shape == (40, 16)
    assert model.model.decoder.embed_tokens.weight is shared is model.lm_head.weight
    model.save_pretrained(tmp_path)
    loaded = DynamicConvForConditionalGeneration.from_pretrained(tmp_path)
    assert torch.equal(loaded.model.encoder.embed_tokens.weight, encoder)
    assert loaded.model.encoder.embed_tokens.weight is not loaded.model.shared.weight
    out = loaded(input_ids=torch.tensor([[23, 5, 2]]), decoder_input_ids=torch.tensor([[2, 39]])).logits
    assert out.shape == (1, 2, 40)


def test_an_encoder_tied_to_a_decoder_of_another_size_is_refused():
    with pytest.raises(ValueError, match="encoder_vocab_size=24 differs from vocab_size=40"):
        DynamicConvConfig(**TINY, encoder_vocab_size=24)
    with pytest.raises(ValueError, match="position_offset must be >= 0"):
        DynamicConvConfig(**TINY, position_offset=-1)


def test_position_offset_shifts_every_position():
    """A model with position_offset=2 computes what the same weights with offset 0 compute at positions + 2."""
    torch.manual_seed(0)
    shifted = DynamicConvForConditionalGeneration(DynamicConvConfig(**TINY, position_offset=2)).eval()
    plain = DynamicConvForConditionalGeneration(DynamicConvConfig(**TINY)).eval()
    plain.load_state_dict(shifted.state_dict())
    src, tgt = torch.tensor([[1, 1, 7, 8, 9, 2]]), torch.tensor([[2, 11, 12, 13]])
    mask = (src != 1).long()
    with torch.no_grad():
        enc = shifted.model.encoder(src, mask).last_hidden_state
        assert not torch.allclose(enc, plain.model.encoder(src, mask).last_hidden_state)
        dec = shifted.model.decoder(tgt, encoder_hidden_states=enc, encoder_attention_mask=mask).last_hidden_state
        ref = plain.model.decoder(tgt, encoder_hidden_states=enc, encoder_attention_mask=mask,
                                  position_ids=torch.arange(4)[None] + 2).last_hidden_state
    torch.testing.assert_close(dec, ref, rtol=0, atol=0)
