"""The omni hooks, written once (RFC-005's protocol over vLLM-Omni's model contract).

- :mod:`core.hooks.contract`: the model contract (vLLM-Omni's hooks), read and
  checked once per model;
- :mod:`core.hooks.batch`: :class:`BatchView`, the scheduled batch as V1 and V2 see it;
- :mod:`core.hooks.talker_mtp`: the talker MTP on persistent buffers;
- :mod:`core.hooks.graphs`: graph policy (when the omni parts run in graphs, the talker MTP's graphs);
- :mod:`core.hooks.step_rows`: :class:`~core.hooks.step_rows.StepRowsCollector`, a step's outputs to its rows in one call;
- :mod:`core.hooks.omni_hooks`: :class:`OmniHooks`, the protocol.
"""

from core.hooks.batch import BatchView
from core.hooks.contract import ModelContract, ModelContractError, read_contract
from core.hooks.omni_hooks import OmniHooks, no_full_graphs
from core.hooks.talker_mtp import TalkerMTP
from core.payloads import MTP_SEED_KEY

__all__ = ["BatchView", "MTP_SEED_KEY", "ModelContract", "ModelContractError", "OmniHooks", "TalkerMTP",
           "no_full_graphs", "read_contract"]
