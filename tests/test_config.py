import pytest

from jaxformer import TransformerConfig
from jaxformer.config import TABLE3_ROWS


def test_paper_presets():
    base = TransformerConfig.paper_base(37000)
    assert (base.num_encoder_layers, base.d_model, base.d_ff, base.num_heads) == (6, 512, 2048, 8)
    assert (base.key_dim, base.value_dim, base.dropout_rate, base.label_smoothing) == (
        64,
        64,
        0.1,
        0.1,
    )
    assert base.norm_placement == "post" and base.position_embedding == "sinusoidal"
    assert base.share_embeddings and not base.use_final_norm
    big = TransformerConfig.paper_big(37000)
    assert (big.d_model, big.d_ff, big.num_heads, big.dropout_rate, big.key_dim) == (
        1024,
        4096,
        16,
        0.3,
        64,
    )
    tiny = TransformerConfig.tiny(300, dropout_rate=0.0)
    assert tiny.vocab_size == 300 and tiny.dropout_rate == 0.0


def test_table3_rows():
    assert TransformerConfig.table3("A1", 100).key_dim == 512
    assert TransformerConfig.table3("B1", 100).key_dim == 16
    assert TransformerConfig.table3("B1", 100).value_dim == 64
    assert TransformerConfig.table3("C4", 100).d_model == 256
    assert TransformerConfig.table3("E", 100).position_embedding == "learned"
    assert TransformerConfig.table3("D3", 100).label_smoothing == 0.0
    for row in TABLE3_ROWS:
        TransformerConfig.table3(row, 100)
    with pytest.raises(ValueError, match="unknown Table 3 row 'Z'"):
        TransformerConfig.table3("Z", 100)


def test_round_trip_and_unknown_keys():
    c = TransformerConfig.tiny(50, norm_placement="pre")
    assert TransformerConfig.from_dict(c.to_dict()) == c
    assert c.replace(d_ff=64).d_ff == 64
    with pytest.raises(ValueError, match=r"unknown config key\(s\) \['d_modle'\]; valid keys are"):
        TransformerConfig.from_dict({"vocab_size": 5, "d_modle": 8})


@pytest.mark.parametrize(
    "fields,error,match",
    [
        (dict(d_model=100, num_heads=8), ValueError, "d_model=100 is not divisible by num_heads=8"),
        (dict(num_kv_heads=3), ValueError, "num_heads=8 is not divisible by num_kv_heads=3"),
        (dict(d_model=0), ValueError, "d_model must be >= 1"),
        (dict(d_model=512.0), TypeError, "d_model must be an int"),
        (dict(vocab_size=True), TypeError, "vocab_size must be an int"),
        (dict(dropout_rate=1.0), ValueError, r"dropout_rate must be in \[0, 1\)"),
        (dict(label_smoothing=-0.1), ValueError, "label_smoothing must be in"),
        (dict(norm_placement="sandwich"), ValueError, "norm_placement must be one of"),
        (dict(activation="tanh"), ValueError, "activation must be one of"),
        (dict(position_embedding="alibi"), ValueError, "position_embedding must be one of"),
        (dict(dtype="float16"), ValueError, "dtype must be one of"),
        (dict(d_model=255, num_heads=5), ValueError, "sinusoidal positions need an even d_model"),
        (
            dict(position_embedding="rope", d_k=7, d_v=8),
            ValueError,
            "rotary embeddings need an even key head dim",
        ),
        (dict(d_model=100, num_heads=8, d_k=12, d_v=12), None, None),
    ],
)
def test_config_checks_itself(fields, error, match):
    fields = dict(vocab_size=fields.pop("vocab_size", 10)) | fields
    if error is None:
        TransformerConfig(**fields)
        return
    with pytest.raises(error, match=match):
        TransformerConfig(**fields)
