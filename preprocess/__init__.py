"""Data preparation for the plug-in: translation corpora and GLUE, into fairseq's binarised layout."""
