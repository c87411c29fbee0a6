"""Runner kinds (light module: importing it imports no vLLM)."""

AR = "ar"  #: autoregressive stage (thinker, talker)
GENERATION = "generation"  #: non-autoregressive stage (code2wav): one forward per request
KINDS = (AR, GENERATION)
