"""hopattn inside real models, through the extension points their libraries offer.

    from hopattn.integrations import transformers as hop_tf, diffusers as hop_df, routing
    hop_tf.register()   # attn_implementation="hopattn"
    hop_df.register()   # set_attention_backend("hopattn") / attention_backend("hopattn")
    with routing.track(strict=True) as report:
        model(...)
    print(report.summary())

``transformers`` and ``diffusers`` import their library only when ``register`` is called, so this
package imports without them. ``kernels`` describes what a kernel serves; ``routing`` counts what
was served and why the rest fell back; ``masks`` tells a causal or empty mask from a real one.

Head dims: what the final forward stage serves (its supports.head_dims, v's head dim possibly other
than q's); the rest falls back, counted. Training goes through the same functions: calls that need a
gradient are served where hopattn's backward serves their head dim (128), and it computes the
gradient (``register(deterministic=True)`` for bitwise reproducible gradients); the others fall back
with that reason and get the fallback's gradient.
"""

from . import kernels, masks, routing

__all__ = ["kernels", "masks", "routing"]
