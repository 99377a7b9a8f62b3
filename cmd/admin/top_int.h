/* SPDX-License-Identifier: MIT */
/* top_int.h: rb-admin top's frames (top_frame.c), for its loop (top.c). */
#ifndef RB_ADMIN_TOP_INT_H
#define RB_ADMIN_TOP_INT_H

#include <jansson.h>

#define TOP_WIDTH	80	/* no line of a frame is wider */

/* A frame: its lines, each at most TOP_WIDTH bytes. */
struct frame {
	char	**line;
	int	  n, cap;
};

/*
 * The frame of stats (rb_admin_stats) and lanes (rb_admin_lanes), for
 * handler pick (NULL: all): a keys line when interval_s > 0; the holders
 * cut to fit rows lines (0: all of them).  Remembers what the next
 * frame's rates and renewals need.
 */
void	frame_build(struct frame *, const json_t *stats, const json_t *lanes, const char *schema,
	    const char *pick, double interval_s, int rows);
void	frame_free(struct frame *);
/* h: the handler after pick in stats (into buf), or NULL after the last */
const char *next_handler(const json_t *stats, const char *pick, char *buf, size_t n);

#endif
