/* loom/loom.h: the whole public API of loom. Programs include this (or the module headers). */
#ifndef LOOM_H
#define LOOM_H

#include "loom/error.h"
#include "loom/comm.h"
#include "loom/gpt2.h"
#include "loom/ddp.h"

#endif
