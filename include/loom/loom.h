/* loom/loom.h: the whole public API of loom. Programs include this (or the module headers). */
#ifndef LOOM_H
#define LOOM_H

#include "loom/error.h"
#include "loom/comm.h"
#include "loom/gpt2.h"
#include "loom/data.h"
#include "loom/tokenizer.h"
#include "loom/ckpt.h"
#include "loom/ddp.h"
#include "loom/mesh.h"
#include "loom/optim.h"
#include "loom/train.h"
#include "loom/util.h"

#endif
