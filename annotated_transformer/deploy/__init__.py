"""Deployment: a trained model put to use, by our decoder or by CTranslate2.

    translator.py       Translator (a checkpoint, ready to translate text; int8 on the CPU), what a
                        --checkpoint names (resolve_checkpoint) and the translator it loads (load_translator,
                        Translator.load)
    text_translator.py  TextTranslator: text in, text out, what every engine's translator shares
    ct2_export.py       a trained model as a CTranslate2 model folder (float32 or int8)
    ct2_translator.py   CT2Translator: an exported folder translated by CTranslate2, Translator's interface

Nothing is imported here; `from annotated_transformer import Translator` loads translator.py on first use.
"""
