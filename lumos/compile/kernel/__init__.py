"""One kernel as loops and statements: the kernel IR (`ir`), a scheduled kernel lowered into it
(`lower`), and the IR-to-IR passes that decide layouts and tiling (`passes`). Nothing here prints
a target's syntax: that is `render/`'s job."""
