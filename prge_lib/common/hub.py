"""Whether the Hugging Face hub can be reached: the one network check, asked by model loading and by the data
loader before they fall back to what is on disk."""
from __future__ import annotations

import socket
from urllib.parse import urlparse


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers a TCP connection (False at once when HF_HUB_OFFLINE is set)."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    url = urlparse(constants.ENDPOINT)
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=timeout):
            return True
    except OSError:
        return False
