"""Who runs when.

  continuous   iteration-level scheduling over slots: admit, prefill, one step for all, free
"""
