#!/usr/bin/env python
"""Convert a fairseq LightConv/DynamicConv, RFA-doc (rfa-doc-mt) or TaLK checkpoint folder into a talk_hf model
folder (docs/converting.md).

    python scripts/convert_fairseq_checkpoint.py wmt16.en-de.joined-dict.dynamicconv-glu dynamicconv-wmt16-en-de
"""

import argparse

from talk_hf.convert_fairseq import convert_fairseq_checkpoint


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("src_dir", help="the unpacked release: model.pt, dict.<src>.txt, dict.<tgt>.txt[, bpecodes]")
    parser.add_argument("out_dir", help="where to write the save_pretrained folder")
    args = parser.parse_args(argv)
    try:
        out_dir = convert_fairseq_checkpoint(args.src_dir, args.out_dir)
    except (FileNotFoundError, FileExistsError, ValueError) as err:  # the converter's refusals, each naming its cause
        parser.error(str(err))
    print(out_dir)


if __name__ == "__main__":
    main()
