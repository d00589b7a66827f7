"""A vLLM v1 KV connector on tensorlane (disaggregated prefill/decode): docs/vllm.md.

``tensorlane.vllm.TensorlaneConnector`` is imported lazily: ``import tensorlane`` and
``import tensorlane.vllm`` import neither vLLM nor torch; the first access to the connector
imports the adapter, which imports vLLM when it is installed and checks its
``KVConnectorBase_V1`` against the release the adapter was written for
(``VLLM_RELEASE``). The planning core (``tensorlane.vllm._plan``) never imports vLLM.

Load it in vLLM with::

    --kv-transfer-config '{"kv_connector": "TensorlaneConnector",
                           "kv_connector_module_path": "tensorlane.vllm",
                           "kv_role": "kv_producer"}'
"""

from __future__ import annotations

from typing import Any

__all__ = ["TensorlaneConnector", "TensorlaneConnectorMetadata", "VLLM_RELEASE", "VLLM_COMMIT"]

#: The vLLM release whose KVConnectorBase_V1 the adapter implements (docs/vllm.md).
VLLM_RELEASE = "v0.11.0"
#: The vLLM commit whose base.py the signatures were checked against (docs/vllm.md).
VLLM_COMMIT = "003df2961dd8830c317a61f9745ccd557da9fa06"

_LAZY = {"TensorlaneConnector", "TensorlaneConnectorMetadata", "check_base", "HAVE_VLLM",
         "BASE_DIFFERENCES"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from . import _connector

        return getattr(_connector, name)
    raise AttributeError(f"module 'tensorlane.vllm' has no attribute {name!r}")
