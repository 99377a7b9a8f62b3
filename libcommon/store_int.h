/* SPDX-License-Identifier: MIT */
/*
 * store_int.h: PRIVATE to the store library.  The ops vtable every backend
 * fills in, and struct rb_store.  A NULL slot means "not supported by this
 * backend"; store.c turns that into RB_EXIT_UNAVAILABLE.
 */
#ifndef STORE_INT_H
#define STORE_INT_H

#include <stdarg.h>

#include "rb_store.h"

struct rb_store_ops {
	const char		*name;		/* "postgresql" */
	const char *const	*schemes;	/* NULL-terminated URL schemes */
	/* connect; -1 + err.  Must leave the store closable on failure. */
	int	(*open)(struct rb_store *, struct rb_error *);
	/* must tolerate a half-opened store */
	void	(*close)(struct rb_store *);
	int	(*reconnect)(struct rb_store *, struct rb_error *);
	bool	(*broken)(const struct rb_store *);
	int	(*setup)(struct rb_store *, const struct rb_setup_opts *, struct rb_error *);
	int	(*schema_info)(struct rb_store *, struct rb_schema_info *, struct rb_error *);
	int	(*publish)(struct rb_store *, const char *, size_t, struct rb_publish_acks *,
		    struct rb_error *);
	int	(*claim)(struct rb_store *, const struct rb_claim_opts *, json_t **, struct rb_error *);
	int	(*claim_send)(struct rb_store *, const struct rb_claim_opts *, struct rb_error *);
	int	(*claim_recv)(struct rb_store *, bool, struct rb_dl ***, struct rb_error *);
	int	(*complete_send)(struct rb_store *, struct rb_dl *const *, size_t, bool, struct rb_error *);
	int	(*complete_recv)(struct rb_store *, bool, unsigned char *, struct rb_error *);
	int	(*extend)(struct rb_store *, const char *, const char *, int64_t, struct rb_error *);
	int	(*complete)(struct rb_store *, const struct rb_complete_opts *, const json_t *,
		    json_t **, struct rb_error *);
	int	(*relinquish)(struct rb_store *, const char *, const char *, struct rb_error *);
	int	(*relinquish_owner)(struct rb_store *, const char *, const char *, struct rb_error *);
	int	(*relinquish_leases)(struct rb_store *, const json_t *, struct rb_error *);
	int	(*listen)(struct rb_store *, struct rb_error *);
	int	(*socket)(const struct rb_store *);
	int	(*fetch_send)(struct rb_store *, struct rb_dl *const *, size_t, bool, struct rb_error *);
	int	(*fetch_recv)(struct rb_store *, bool, struct rb_error *);
	int	(*fetch_socket)(const struct rb_store *);
	int	(*complete_socket)(const struct rb_store *);
	int	(*notified)(struct rb_store *, const char *, int, struct rb_error *);
};

struct rb_store {
	const struct rb_store_ops *ops;
	char	*url;		/* as given; NULL = environment */
	char	*url_redacted;
	char	*schema;	/* validated identifier */
	char	*app;
	void	*be;		/* backend state */
};

extern const struct rb_store_ops rb_store_pg_ops;

/** Fill err; returns -1. */
int	rb_seterr(struct rb_error *, int code, const char *fmt, ...)
	    __attribute__((format(printf, 3, 4)));

#endif
